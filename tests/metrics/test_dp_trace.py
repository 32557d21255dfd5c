"""The DP collectives in a traced step (csrc/comm/comm_trace.h, hybrid_engine/metrics/trace.py): every gradient bucket's
all-reduce (gloo's stand-in for the reduce-scatter) and, under ZeRO-1, every parameter all-gather the forward waited
for, beside the compute actions on one clock; the written Chrome trace stays valid and readable."""
from __future__ import annotations

import json
import re

import pytest
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.metrics.trace import comm_rows_of_chrome_trace, rows_of_chrome_trace

DIM, DEPTH, BATCH = 32, 4, 16


def traced(rank: int, world: int, zero: int) -> dict:
    groups = build_groups(ProcessGrid(2, 1, 1), rank)
    engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, micro_batches=2, zero=zero, trace=True,
                         dp_bucket_mb=0.004)  # one layer per bucket
    out = {"buckets": len(engine.grads.buckets)}
    for step in range(3):
        x, y = SyntheticRegression(DIM, 0, "cpu").batch(step, BATCH)
        d = groups.coords.dp
        engine.train_step(x[d * 8:(d + 1) * 8], y[d * 8:(d + 1) * 8])
        out.setdefault("comm", []).append([(c.kind, c.bucket, c.start_us, c.end_us) for c in engine.comm_trace])
    out["compute"] = [(e.start_us, e.end_us) for e in engine.trace]
    engine.close()
    groups.destroy()
    dist.barrier()
    return out


@pytest.mark.parametrize("zero", [0, 1])
def test_a_traced_dp2_step_shows_each_bucket_collective_beside_compute(zero):
    for out in run_ranks(2, traced, zero, timeout=120):
        buckets = range(out["buckets"])
        step_end = max(end for _, end in out["compute"])
        for step, comm in enumerate(out["comm"]):
            reduces = sorted(b for kind, b, _, _ in comm if kind == "all_reduce")  # gloo: no reduce-scatter
            gathers = sorted(b for kind, b, _, _ in comm if kind == "all_gather")
            assert reduces == list(buckets)  # one per bucket, every step
            # ZeRO-1: the gathers the forward waited for, launched by the previous step's update
            assert gathers == (list(buckets) if zero and step > 0 else [])
            assert all(start <= end for _, _, start, end in comm)
        last = out["comm"][-1]
        for kind, _, start, end in last:
            if kind == "all_reduce":  # launched during this step's backward, done by its end
                assert 0 <= start <= step_end and end <= step_end + 1e6
            else:
                assert start < 0  # launched before the step began


def _count(stdout: str, what: str) -> int:
    found = re.search(rf"(\d+) {what}", stdout)
    return int(found.group(1)) if found else 0


def test_driver_trace_of_a_zero1_dp2_run_holds_the_collectives(tmp_path):
    from launch_utils import torchrun

    trace = tmp_path / "t"
    run = torchrun(2, "--dp", "2", "--zero", "1", "--dim", "32", "--depth", "4", "--batch-size", "16",
                   "--micro-batches", "2", "--steps", "3", "--trace", str(trace))
    assert run.returncode == 0, run.stderr[-2000:]
    with open(f"{trace}.json") as f:
        data = json.load(f)  # valid JSON
    events = data["traceEvents"]
    collectives = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert sorted(e["cat"] for e in collectives) == ["all_gather", "all_reduce"]  # one bucket (default cap)
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in events if e["ph"] == "X")  # Chrome wants times from 0
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"compute (thread: pipeline rank)",
                                                                     "DP collectives (thread: pipeline rank)"}
    assert data["otherData"]["dp_collectives"] == {"all_gather": 1, "all_reduce": 1}
    compute = rows_of_chrome_trace(f"{trace}.json")
    assert len(compute) == 1 and {kind for kind, *_ in compute[0]} == {"F", "B"}
    assert min(start for *_, start, _ in compute[0]) >= 0  # the step's clock, as the executor measured it
    (comm,) = comm_rows_of_chrome_trace(f"{trace}.json")
    gather = next(span for span in comm if span[0] == "all_gather")
    assert gather[2] < 0  # on the step's clock: launched by the previous update
    assert (tmp_path / "t.png").exists()
    assert _count(run.stdout, "all_gather") == 1 and _count(run.stdout, "all_reduce") == 1
