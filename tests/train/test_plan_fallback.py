"""Out of memory on the first step under the planner's plan: the engine is released, the next plan that fits and
needs less is taken and said in one line, and the run trains as that plan given by hand does (CPU, an injected
torch.OutOfMemoryError: HYBRID_ENGINE_TEST_OOM_AT_STEP)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from hybrid_engine.metrics import records
from launch_utils import DRIVER, REPO, torchrun

MODEL = ("--dim", "16", "--depth", "4", "--batch-size", "64", "--steps", "3", "--quiet")
OOM = {"HYBRID_ENGINE_TEST_OOM_AT_STEP": "0"}


def drive(tmp_path, name: str, *flags: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list]:
    metrics = tmp_path / f"{name}.jsonl"
    run = subprocess.run([sys.executable, str(DRIVER), *MODEL, *flags, "--metrics", str(metrics)], cwd=REPO,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **(env or {})),
                         capture_output=True, text=True, timeout=120)
    losses = [r["loss"] for r in records.steps(records.read(metrics))] if metrics.exists() else []
    return run, losses


def fallback_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "ran out of memory" in line]
    assert len(lines) == 1, out
    return lines[0]


def test_the_first_step_out_of_memory_takes_the_next_plan_and_trains_as_it_given_by_hand(tmp_path):
    run, losses = drive(tmp_path, "auto", env=OOM)
    assert run.returncode == 0, run.stderr
    line = fallback_line(run.stdout)
    assert line.startswith("planner: the first step ran out of memory on rank 0 under 1f1b, 4 micro-batches "
                           "(predicted "), line
    flags = re.search(r"released it and took .* \(predicted [\d.]+ GiB; as flags: (.*)\)$", line).group(1).split()
    assert flags[:4] == ["--schedule", "1f1b", "--micro-batches", "8"]  # half the rows in flight
    by_hand, expected = drive(tmp_path, "by_hand", *flags)
    assert by_hand.returncode == 0 and len(losses) == 3 and losses == expected


def test_a_plan_the_user_gave_is_not_changed_out_of_memory_ends_the_run(tmp_path):
    given = ("--schedule", "1f1b", "--micro-batches", "4", "--virtual-stages", "1", "--lookahead", "0",
             "--no-merge-wgrad")
    run, _ = drive(tmp_path, "given", *given, env=OOM)
    assert run.returncode == 1 and "ran out of memory on rank" not in run.stdout + run.stderr
    assert "OutOfMemoryError: injected out of memory at step 0" in run.stderr, run.stderr
    # what the flags fix stays fixed: 4 micro-batches leave no plan that needs less, said in one line
    run, _ = drive(tmp_path, "fixed_count", *given[:4], env=OOM)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("hybrid_engine: error: planner: the first step ran out of memory on rank 0 under "
                                 "1f1b, 4 micro-batches (predicted 0.0000148 GiB of ") and \
        run.stderr.endswith(", and no other plan that fits is predicted to need less (add ranks, use a higher "
                            "--zero or --recompute full)\n"), run.stderr


def test_every_rank_of_a_grid_agrees_and_switches_once(tmp_path):
    metrics = tmp_path / "dp2.jsonl"
    run = torchrun(2, "--dp", "2", *MODEL, "--metrics", str(metrics), extra_env=OOM, timeout=100)
    assert run.returncode == 0, run.stderr
    line = fallback_line(run.stdout)
    assert "on ranks 0, 1 under 1f1b, 4 micro-batches" in line and "took 1f1b, 8 micro-batches" in line, line
    assert len([json.loads(x) for x in metrics.read_text().splitlines()]) >= 3
