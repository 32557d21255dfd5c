"""The driver refits its cost model after the first measured steps and records predicted beside measured every
step (CPU ranks planned as H100s: --plan-card h100, so the refit has much to learn)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybrid_engine.metrics import records
from launch_utils import DRIVER, REPO, torchrun


@pytest.mark.parametrize("trace", [False, True])
def test_the_refit_is_said_once_and_every_step_records_its_prediction(tmp_path, trace):
    metrics = tmp_path / "m.jsonl"
    flags = ["--dim", "64", "--depth", "4", "--batch-size", "64", "--steps", "8", "--warmup", "2", "--plan-card",
             "h100", "--metrics", str(metrics), "--quiet"] + (["--trace", str(tmp_path / "t")] if trace else [])
    run = subprocess.run([sys.executable, str(DRIVER), *flags], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stdout.splitlines() if line.startswith("planner: refit")]
    source = "3 measured steps and their traced actions" if trace else "3 measured steps"
    assert len(said) == 1 and said[0].startswith(f"planner: refit from {source}: compute x"), run.stdout
    found = records.read(metrics)
    steps = records.steps(found)  # the last also carries the summary
    assert [r["step"] for r in steps] == list(range(8))
    assert all(r["predicted_step_time_s"] > 0 and r["predicted_peak_mem_gib"] > 0 for r in steps)
    refit = next(r for r in found if records.kind(r) == records.REFIT)
    assert refit["step"] == 4  # after warm-up steps 0-1 and measured steps 2-4
    # from the refit on, each step is predicted with the refitted model (the plan run then, switched or not)
    after = {r["predicted_step_time_s"] for r in steps if r["step"] > 4}
    assert len(after) == 1 and after != {steps[0]["predicted_step_time_s"]}
    if refit["refit"]["host_action_s"] is None:
        assert refit["refit"]["predicted_step_time_s"] == pytest.approx(refit["refit"]["measured_step_time_s"],
                                                                        rel=1e-3)
    assert not trace or refit["refit"]["host_action_s"] is not None


def test_dp_ranks_refit_the_link_from_their_traced_collectives(tmp_path):
    metrics = tmp_path / "m.jsonl"
    run = torchrun(2, "--dp", "2", "--dim", "64", "--depth", "4", "--batch-size", "64", "--steps", "7", "--warmup",
                   "2", "--plan-card", "h100", "--metrics", str(metrics), "--trace", str(tmp_path / "t"), "--quiet",
                   timeout=100)
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stdout.splitlines() if line.startswith("planner: refit")]
    assert len(said) == 1 and "GB/s" in said[0], run.stdout
    refit = next(json.loads(line) for line in metrics.read_text().splitlines() if "refit" in json.loads(line))
    assert 0 < refit["refit"]["allreduce_bytes_s"] < 350e9  # a CPU's gloo, far below the H100 table's
    # a record's first key names its kind: a line that starts '{"step"' is a step's (metrics/records.py)
    assert not next(line for line in metrics.read_text().splitlines() if '"refit"' in line).startswith('{"step"')
    assert records.kind(refit) == records.REFIT
