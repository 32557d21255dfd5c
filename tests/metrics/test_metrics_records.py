"""A --metrics file's records each lead with the key that names their kind, and the one reader of them
(hybrid_engine/metrics/records.py) takes the timed steps alone: one CPU driver run with validations (--eval-every)
and the planner's refit (--plan-card) among its steps, read by the reader and by a results script that asks it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from hybrid_engine.metrics import records
from launch_utils import DRIVER, REPO

sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import realtext_results  # noqa: E402

STEPS = 6


def test_every_record_leads_with_its_kind_and_the_step_reader_takes_the_timed_steps_alone(tmp_path):
    metrics = tmp_path / "m.jsonl"
    run = subprocess.run([sys.executable, str(DRIVER), "--model", "gpt", "--seq-len", "16", "--layers", "2",
                          "--hidden", "32", "--heads", "4", "--batch-size", "8", "--steps", str(STEPS), "--warmup",
                          "1", "--eval-every", "2", "--plan-card", "h100", "--metrics", str(metrics), "--quiet"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = metrics.read_text().splitlines()
    found = [json.loads(line) for line in lines]
    assert records.read(metrics) == found
    firsts = [next(iter(r)) for r in found]
    assert {"step", "val_loss", "refit"} <= set(firsts) and set(firsts) <= set(records.KINDS), firsts
    assert [records.kind(r) for r in found] == firsts  # the first key is the kind

    steps = records.steps(found)
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert all(isinstance(r["step_time_s"], float) and isinstance(r["loss"], float) for r in steps)
    # a reader that takes a line that starts '{"step"' for a timed step takes exactly these
    assert [json.loads(line) for line in lines if line.startswith('{"step"')] == steps
    assert list(records.validation_losses(found)) == [1, 3, 5]
    assert all(r["val_loss"] > 0 for r in found if records.kind(r) == records.VALIDATION)

    run_row = realtext_results.read_run(str(metrics), warmup=1)
    assert run_row["steps"] == STEPS and [s for s, _ in run_row["val_loss"]] == [1, 3, 5]
    assert run_row["train_loss"] == [round(r["loss"], 6) for r in steps]


def test_a_validation_that_leads_with_its_step_is_still_a_validation():
    """Results files already written hold their validations as {"step", "val_loss", ...}."""
    text = "\n".join(json.dumps(r) for r in (
        {"step": 0, "loss": 3.0, "step_time_s": 0.1}, {"step": 0, "val_loss": 2.5, "entropy_floor": None},
        {"step": 1, "loss": 2.0, "step_time_s": 0.1}, {"step": 0, "loss": 2.9, "step_time_s": 0.1}))
    found = records.parse(text + "\n\n")
    assert [records.kind(r) for r in found] == ["step", "val_loss", "step", "step"]
    assert [r["loss"] for r in records.steps(found)] == [3.0, 2.0, 2.9]
    assert [r["loss"] for r in records.last_steps(found)] == [2.9, 2.0]  # a resumed run's replay: the last wins
    assert records.validation_losses(found) == {0: 2.5}
