"""The DP collectives in a traced step (csrc/comm/comm_trace.h, hybrid_engine/metrics/trace.py), beside the compute
actions on one clock: every gradient bucket's reduction (gloo's all-reduce stands in for the reduce-scatter) and every
parameter all-gather: ZeRO-1 and 2's, launched by the previous step's update; ZeRO-3's, ahead of the forward and,
where an autograd stage without a pipeline releases the parameters after it, again ahead of the backward; a
pipeline stage's, once a step. The driver's written Chrome trace draws them on its DP rows and stays valid."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.metrics.trace import comm_rows_of_chrome_trace, rows_of_chrome_trace

DIM, DEPTH, BATCH, MICRO = 32, 4, 16, 2
STEPS = 3


def run_of(zero: int, pp: int = 1, impl: str = "auto") -> dict:
    return {"zero": zero, "pp": pp, "impl": impl}


DP2 = {"zero0": run_of(0), "zero1": run_of(1), "zero2": run_of(2), "zero3": run_of(3),
       "zero3_autograd": run_of(3, impl="autograd")}
PP2 = {"zero3": run_of(3, pp=2), "zero3_autograd": run_of(3, pp=2, impl="autograd")}


def traced(rank: int, world: int, runs: dict[str, dict]) -> dict[str, dict]:
    """Every run on the same ranks: each step's DP collectives and compute actions."""
    results = {}
    for name, run in runs.items():
        dp = world // run["pp"]
        groups = build_groups(ProcessGrid(dp, run["pp"], 1), rank)
        engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, micro_batches=MICRO, zero=run["zero"],
                             trace=True, dp_bucket_mb=0.004, stage_impl=run["impl"])  # one layer per bucket
        out = {"buckets": len(engine.grads.buckets), "comm": [], "actions": []}
        per = BATCH // dp
        for step in range(STEPS):
            x, y = SyntheticRegression(DIM, 0, "cpu").batch(step, BATCH)
            d = groups.coords.dp
            engine.train_step(x[d * per:(d + 1) * per], y[d * per:(d + 1) * per])
            out["comm"].append([(c.kind, c.bucket, c.start_us, c.end_us) for c in engine.comm_trace])
            out["actions"].append([(e.action.type.name, e.action.micro, e.start_us, e.end_us) for e in engine.trace])
        out["compute"] = [(e.start_us, e.end_us) for e in engine.trace]
        engine.close()
        groups.destroy()
        dist.barrier()
        results[name] = out
    return results


@pytest.fixture(scope="module")
def dp2():
    return run_ranks(2, traced, DP2, timeout=180)


@pytest.fixture(scope="module")
def dp2_pp2():
    return run_ranks(4, traced, PP2, timeout=180)


def gathers_needed(run: dict, step: int, bucket: int, buckets: int) -> list[tuple[str, int]]:
    """The actions (type, micro-batch) of a step whose layers wait for a gather of `bucket`'s parameters: one per
    gather, in order. Buckets are packed last layer first, so bucket `buckets - 1` holds the first layer."""
    if run["zero"] in (1, 2):  # the previous update's gathers, waited for by the first forward
        return [("F", 0)] if step > 0 else []
    if run["zero"] == 0:
        return []
    if run["pp"] > 1 or run["impl"] != "autograd":  # kept gathered from the first forward to the last backward
        return [("F", 0)]
    # Released after each forward and gathered again for its backward; the first layer's bucket is not released
    # after a backward (its input has no gradient to hook), so the next forward finds it whole.
    if bucket == buckets - 1:
        return [("F", 0)] + [("B", k) for k in range(MICRO)]
    return [(kind, k) for k in range(MICRO) for kind in ("F", "B")]


def launched_before_the_step(run: dict, buckets: int) -> list[int]:
    """The buckets whose gather started before the step's clock: all of them for ZeRO-1/2 (the previous update)
    and a native stage (no hook can launch one inside its forward, so the step's start launches them all); for an
    autograd stage the first one the forward reads (prefetch 1), the rest launched by the layers ahead of them."""
    return [buckets - 1] if run["zero"] == 3 and run["impl"] == "autograd" else list(range(buckets))


def check_step(run: dict, step: int, buckets: int, comm: list, actions: list) -> None:
    """One rank's step. Ordering guarantee (gloo, host clock): a layer waits for its bucket's gather inside the
    action that runs it, so each gather completes before that action ends, and starts inside it or, for the ones
    listed by launched_before_the_step, before the step's clock starts. Each reduction is launched from the
    backward that completes its bucket or right after it, before the next action starts."""
    spans = {(kind, micro): (start, end) for kind, micro, start, end in actions}
    per_micro = run["zero"] >= 2 and run["pp"] == 1  # a pipeline stage reduces once, after its last backward
    reduced_after = list(range(MICRO)) if per_micro else [MICRO - 1]
    assert {kind for kind, *_ in comm} <= {"all_reduce", "all_gather"}  # gloo: no reduce-scatter
    for b in range(buckets):
        launches = sorted(start for kind, bucket, start, _ in comm if kind == "all_reduce" and bucket == b)
        assert len(launches) == len(reduced_after), (run, step, b)
        for start, micro in zip(launches, reduced_after):
            assert spans["B", micro][0] <= start
            if micro + 1 < MICRO and per_micro:
                assert start <= spans["F", micro + 1][0]
        gathers = sorted((start, end) for kind, bucket, start, end in comm if kind == "all_gather" and bucket == b)
        needed = gathers_needed(run, step, b, buckets)
        if run["zero"] == 3 and step == 0:  # the executor's shape probe, a forward before the first step, gathers too
            assert len(gathers) >= len(needed)
            continue
        assert len(gathers) == len(needed), (run, step, b, gathers)
        for (start, end), action in zip(gathers, needed):
            action_start, action_end = spans[action]
            assert start < 0 or action_start <= start, (run, step, b, action)
            assert start <= end <= action_end, (run, step, b, action)
    if step > 0 and run["zero"]:
        assert sorted(b for kind, b, start, _ in comm if kind == "all_gather" and start < 0) == \
            launched_before_the_step(run, buckets)


@pytest.mark.parametrize("zero", [0, 1])
def test_a_traced_dp2_step_shows_each_bucket_collective_beside_compute(dp2, zero):
    for out in (rank[f"zero{zero}"] for rank in dp2):
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


@pytest.mark.parametrize("name", list(DP2))
def test_every_zero_level_traces_each_reduction_and_gather_inside_the_action_that_needs_it(dp2, name):
    """dp2, 4 one-layer buckets, 2 micro-batches: zero 2 and 3 reduce each bucket after every micro-batch's
    backward (0 and 1 once a step); zero 3 through the native chain gathers each bucket once a step, through autograd
    before each micro-batch's forward and again before its backward."""
    run = DP2[name]
    for out in (rank[name] for rank in dp2):
        assert out["buckets"] == DEPTH
        for step in range(STEPS):
            check_step(run, step, out["buckets"], out["comm"][step], out["actions"][step])
        if name == "zero3_autograd":  # the counts check_step asserted, spelled out: 2m, the first layer's m + 1
            gathers = Counter(b for kind, b, *_ in out["comm"][-1] if kind == "all_gather")
            assert gathers == {0: 2 * MICRO, 1: 2 * MICRO, 2: 2 * MICRO, 3: MICRO + 1}


@pytest.mark.parametrize("name", list(PP2))
def test_zero3_on_a_pipeline_gathers_each_stage_once_a_step(dp2_pp2, name):
    """dp2 x pp2: each pipeline rank's stage (2 one-layer buckets) gathers each bucket once a step, completed within
    its first forward and kept to its last backward (no gather after it), and reduces each once, after its last
    backward."""
    for out in (rank[name] for rank in dp2_pp2):
        assert out["buckets"] == DEPTH // 2
        for step in range(STEPS):
            check_step(PP2[name], step, out["buckets"], out["comm"][step], out["actions"][step])
        first_forward_end = next(end for kind, micro, _, end in out["actions"][-1] if (kind, micro) == ("F", 0))
        assert all(end <= first_forward_end for kind, _, _, end in out["comm"][-1] if kind == "all_gather")


def _count(stdout: str, what: str) -> int:
    found = re.search(rf"(\d+) {what}", stdout)
    return int(found.group(1)) if found else 0


def _read_driver_trace(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)  # valid JSON
    events = data["traceEvents"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in events if e["ph"] == "X")  # Chrome wants times from 0
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"compute (thread: pipeline rank)",
                                                                     "DP collectives (thread: pipeline rank)"}
    return data


def test_driver_trace_of_a_zero1_dp2_run_holds_the_collectives(tmp_path):
    from launch_utils import torchrun

    trace = tmp_path / "t"
    run = torchrun(2, "--dp", "2", "--zero", "1", "--dim", "32", "--depth", "4", "--batch-size", "16",
                   "--micro-batches", "2", "--steps", "3", "--trace", str(trace))
    assert run.returncode == 0, run.stderr[-2000:]
    data = _read_driver_trace(f"{trace}.json")
    collectives = [e for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert sorted(e["cat"] for e in collectives) == ["all_gather", "all_reduce"]  # one bucket (default cap)
    assert data["otherData"]["dp_collectives"] == {"all_gather": 1, "all_reduce": 1}
    compute = rows_of_chrome_trace(f"{trace}.json")
    assert len(compute) == 1 and {kind for kind, *_ in compute[0]} == {"F", "B"}
    assert min(start for *_, start, _ in compute[0]) >= 0  # the step's clock, as the executor measured it
    (comm,) = comm_rows_of_chrome_trace(f"{trace}.json")
    gather = next(span for span in comm if span[0] == "all_gather")
    assert gather[2] < 0  # on the step's clock: launched by the previous update
    assert (tmp_path / "t.png").exists()
    assert _count(run.stdout, "all_gather") == 1 and _count(run.stdout, "all_reduce") == 1


@pytest.mark.parametrize("flags, run, per_row", [
    # one bucket (the default cap), 2 micro-batches: reduced after each backward; gathered by the previous update
    (("--zero", "2"), run_of(2), {"all_gather": 1, "all_reduce": 2}),
    # the bucket holds the first layer: gathered for the first forward and for each backward
    (("--zero", "3", "--stage-impl", "autograd"), run_of(3, impl="autograd"), {"all_gather": 3, "all_reduce": 2}),
    # each stage's bucket gathered once, reduced once, on each pipeline rank's DP row
    (("--zero", "3", "--pp", "2"), run_of(3, pp=2), {"all_gather": 1, "all_reduce": 1}),
], ids=["zero2", "zero3_autograd", "zero3_pp2"])
def test_driver_trace_of_zero2_and_zero3_draws_the_collectives_on_the_dp_rows(tmp_path, flags, run, per_row):
    from launch_utils import torchrun

    trace = tmp_path / "t"
    result = torchrun(2 * run["pp"], "--dp", "2", *flags, "--dim", "32", "--depth", "4", "--batch-size", "16",
                      "--micro-batches", "2", "--steps", str(STEPS), "--trace", str(trace))
    assert result.returncode == 0, result.stderr[-2000:]
    data = _read_driver_trace(f"{trace}.json")
    compute = rows_of_chrome_trace(f"{trace}.json")
    comm = comm_rows_of_chrome_trace(f"{trace}.json")
    assert len(compute) == len(comm) == run["pp"]  # a DP row per pipeline rank
    for actions, row in zip(compute, comm):
        assert Counter(kind for kind, *_ in row) == per_row
        check_step(run, STEPS - 1, 1, row, [(kind, micro, start, end) for kind, _, micro, start, end in actions])
    total = {kind: n * run["pp"] for kind, n in per_row.items()}
    assert data["otherData"]["dp_collectives"] == total
    assert all(_count(result.stdout, kind) == n for kind, n in total.items())
    assert (tmp_path / "t.png").exists()
