"""The driver with --cp: a run on cp 2 draws each rank's chunks only, streamed or whole, and trains, validates and
reports what one process does (the same losses and validation loss, its metrics' tokens counted once for the whole
sequences); --trace draws the ring's hops. One launch per mode."""
from __future__ import annotations

import json

import pytest

from hybrid_engine.metrics import records as metrics_records
from launch_utils import torchrun

FLAGS = ["--model", "gpt", "--seq-len", "32", "--layers", "2", "--hidden", "32", "--heads", "4", "--steps", "3",
         "--batch-size", "4", "--micro-batches", "2", "--schedule", "1f1b", "--eval-every", "3"]


def _run(tmp_path, name: str, nproc: int, *extra: str) -> list[dict]:
    metrics = tmp_path / f"{name}.jsonl"
    done = torchrun(nproc, *FLAGS, "--metrics", str(metrics), *extra, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in metrics.read_text().splitlines()], done.stdout


def test_cp2_streamed_or_whole_trains_and_validates_what_one_process_does(tmp_path):
    one, _ = _run(tmp_path, "one", 1)
    whole, out = _run(tmp_path, "cp2", 2, "--cp", "2", "--cp-comm", "ring", "--trace", str(tmp_path / "t"))
    streamed, said = _run(tmp_path, "cp2_stream", 2, "--cp", "2", "--stream-data")
    for records in (whole, streamed):
        steps = metrics_records.steps(records)
        assert [r["loss"] for r in steps] == pytest.approx([r["loss"] for r in metrics_records.steps(one)], rel=1e-5)
        val = next(iter(metrics_records.validation_losses(records).values()))
        assert val == pytest.approx(next(iter(metrics_records.validation_losses(one).values())), rel=1e-5)
        assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 32, rel=0.05) for r in steps)
    assert "context parallel: cp 2, 16 tokens per rank, ring attention (--cp-comm)" in out
    # --cp-comm auto: the planner's rule on the CPU card's rates, said once with its numbers
    auto = [line for line in said.splitlines() if line.startswith("context parallel: cp 2, 16 tokens per rank, ")]
    assert len(auto) == 1 and "attention (auto: K/V traffic exposes " in auto[0]
    assert " ms a layer and micro-batch against the " in auto[0]
    assert "CP collectives beside them: 16 send_recv" in out  # 2 micro-batches x 2 blocks x (1 + 1 + 2) hops
    assert "summary: 2 ranks (1 dp x 2 cp x 1 pp x 1 mp)" in out
