"""The native tensor-parallel chain (csrc/tp/linear_chain.h): the MLP's column/row-parallel pairs run in the C++
stage program, their MP collectives asynchronous and cut into row chunks. It must train exactly the model a single
process trains (fp32, CPU: relative 1e-5), on every schedule, with recomputation, merged weight gradients, DP and
ZeRO-1, mp 2 and 4, an odd layer count (a last column-parallel layer that all-gathers), and any chunk count; it is
what `auto` picks for tensor-parallel MLP stages, and `--stage-impl autograd` still gives the module path."""
from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_utils import run_ranks
from engine_builders import make_engine
from engine_reference import reference_run
from hybrid_engine import ProcessGrid
from hybrid_engine.config.engine import PrecisionConfig, StageConfig
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.parallel.pipeline.stages import plan_stages
from hybrid_engine.metrics.trace import comm_rows_of_chrome_trace, write_trace

DIM, BATCH, MICRO, STEPS, LR = 32, 48, 4, 3, 0.05


def train(rank: int, world: int, runs: list[dict]) -> list[dict]:
    """Each run: a grid and engine options; returns its losses, its stage programs and (from the ranks that hold
    DP replica 0) its full final weights."""
    out = []
    for run in runs:
        dp, pp, mp = run["grid"]
        groups = build_groups(ProcessGrid(dp, pp, mp), rank)
        depth = run.get("depth", 8)
        engine = make_engine(large_linear_model(DIM, depth, 0), groups, schedule=run.get("schedule", "1f1b"),
                             micro_batches=run.get("micro", MICRO), virtual_stages=run.get("v", 1), lr=LR,
                             merge_weight_grads=run.get("merge", False), recompute=run.get("recompute", False),
                             zero=run.get("zero", 0), tp_chunks=run.get("chunks", 0), amp=run.get("amp", "off"),
                             stage_impl=run.get("impl", "auto"), trace=run.get("trace", False))
        data = SyntheticRegression(DIM, 0, "cpu")
        per_dp, d = BATCH // dp, groups.coords.dp
        losses, comm = [], []
        for step in range(STEPS):
            x, y = data.batch(step, BATCH, d * per_dp, (d + 1) * per_dp)
            losses.append(engine.train_step(x, y).loss)
            comm.append([(c.axis, c.kind, c.bucket) for c in engine.comm_trace])
        state = {k: v.numpy() for k, v in engine.full_state_dict().items()}
        out.append({"losses": losses, "programs": {s: p.describe() for s, p in engine.stage_programs.items()},
                    "overwrites": engine._executor.overwrites_weight_grads,
                    "native": all(p.native for p in engine.stage_programs.values()),
                    "state": state if d == 0 else {}, "comm": comm})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


@functools.lru_cache(maxsize=None)
def reference(depth: int, micro: int = MICRO):
    return reference_run(DIM, depth, BATCH, micro, STEPS, LR)


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_matches_reference(per_rank: list[dict], depth: int, what, micro: int = MICRO) -> None:
    ref_losses, ref_state = reference(depth, micro)
    state = {}
    for out in per_rank:
        assert out["losses"] == pytest.approx(ref_losses, rel=1e-5), what
        state.update(out["state"])
    assert set(state) == set(ref_state), what
    worst = max(_rel(state[k], ref_state[k]) for k in ref_state)
    assert worst < 1e-5, (what, worst)


def sweep_runs() -> list[dict]:
    """Every schedule (with and without recomputation and merged W) on the 4-rank grids with an MP axis, ZeRO-1
    where there is DP, mp 4, odd layer counts; the chunk count cycles through 1, 2 and 3 (uneven chunks of the
    6- and 12-row micro-batches)."""
    runs = []
    schedules = {1: [("1f1b", 1, False), ("zb1", 1, True)],
                 2: [("1f1b", 1, False), ("gpipe", 1, False), ("interleaved", 2, False), ("zb1", 1, False),
                     ("zb1", 1, True)]}
    for grid in ((1, 1, 4), (2, 1, 2), (1, 2, 2)):
        for schedule, v, merge in schedules[grid[1]] + ([("zb1", 1, False)] if grid == (2, 1, 2) else []):
            for recompute in (False, True):
                for zero in ((0, 1) if grid[0] > 1 else (0,)):
                    runs.append(dict(grid=grid, schedule=schedule, v=v, merge=merge, recompute=recompute, zero=zero,
                                     chunks=1 + len(runs) % 3))
    runs.append(dict(grid=(2, 1, 2), depth=7, chunks=2, zero=1))  # the last layer all-gathers its output
    runs.append(dict(grid=(1, 2, 2), depth=6, chunks=3, schedule="zb1", merge=True))  # one in each stage
    # One micro-batch: each B is every gradient's only write of the step, which then overwrites the buffers
    runs += [dict(grid=grid, micro=1, chunks=2, zero=zero, recompute=recompute)
             for grid, zero, recompute in (((1, 1, 4), 0, False), ((2, 1, 2), 1, True), ((2, 1, 2), 0, False),
                                           ((1, 2, 2), 0, False), ((4, 1, 1), 0, False))]
    return runs


@pytest.fixture(scope="module")
def sweep():
    runs = sweep_runs()
    return runs, run_ranks(4, train, runs, timeout=400)


def test_every_schedule_on_every_tp_grid_matches_the_single_process_run(sweep):
    runs, results = sweep
    for index, run in enumerate(runs):
        per_rank = [results[r][index] for r in range(4)]
        assert_matches_reference(per_rank, run.get("depth", 8), run, run.get("micro", MICRO))
        assert all(out["overwrites"] == (run.get("micro") == 1 or run.get("merge", False)) for out in per_rank), run


def test_auto_runs_tensor_parallel_stages_as_native_chains(sweep):
    runs, results = sweep
    for index, run in enumerate(runs):
        mp = run["grid"][2]
        what = "native Linear+ReLU chain" if mp == 1 else f"native tensor-parallel Linear+ReLU chain, mp {mp}"
        for out in (results[r][index] for r in range(4)):
            assert out["native"], run
            assert all(what in d or what.replace("+ReLU", "(+ReLU)") in d for d in out["programs"].values()), (
                run, out["programs"])


COMPARE = [
    dict(grid=(1, 1, 2), amp="bf16"),
    dict(grid=(2, 1, 2), amp="fp16", schedule="zb1", merge=True, zero=1),
    dict(grid=(1, 2, 2), amp="fp16", recompute=True),
    dict(grid=(1, 1, 2), depth=7),
]


@pytest.fixture(scope="module")
def native_and_autograd():
    runs = [dict(run, impl=impl, chunks=1) for run in COMPARE for impl in ("auto", "autograd")]
    return runs, run_ranks(4, train, [r for r in runs if r["grid"] != (1, 1, 2)], timeout=300), \
        run_ranks(2, train, [r for r in runs if r["grid"] == (1, 1, 2)], timeout=300)


def test_autograd_stage_impl_keeps_the_module_path_and_trains_the_same_model(native_and_autograd):
    """Half weights (fp32 masters and main grads, the fused SGD + cast, ZeRO-1) and fp32: the native chain and
    the autograd modules compute the same thing, kernel for kernel."""
    runs, four, two = native_and_autograd
    results = {4: iter(zip(*four)), 2: iter(zip(*two))}
    for run in runs[::2]:
        world = 2 if run["grid"] == (1, 1, 2) else 4
        native, plain = next(results[world]), next(results[world])
        for n, p in zip(native, plain):
            assert n["native"] and not p["native"], run
            assert n["losses"] == pytest.approx(p["losses"], rel=1e-5 if run.get("amp") else 1e-6), run
            for key in n["state"]:
                assert _rel(n["state"][key], p["state"][key]) < (1e-3 if run.get("amp") else 1e-6), (run, key)


def test_a_traced_step_records_each_layers_mp_collectives():
    """depth 4 on mp 2: forward all-reduces after the row-parallel layers 1 and 3, backward after the column
    layer 2 (layer 0's input gradient is not needed on the first stage), one per row chunk and micro-batch. (The
    first step also holds the shape probe's forward through the modules, before the executor exists.)"""
    [[out], _] = run_ranks(2, train, [dict(grid=(1, 1, 2), depth=4, chunks=2, trace=True)], timeout=120)
    for comm in out["comm"][1:]:
        mp = sorted((kind, layer) for axis, kind, layer in comm if axis == "mp")
        assert mp == sorted([("all_reduce", 1)] * 8 + [("all_reduce", 3)] * 8 + [("all_reduce", 2)] * 8)
        assert [c for c in comm if c[0] == "dp"] == []


def test_plan_names_the_tensor_parallel_chain_and_its_chunks():
    model = large_linear_model(16, 4, 0, device="meta")
    layout = [[0, 1, 2, 3], [4, 5, 6, 7]]
    off = PrecisionConfig()
    plans = plan_stages(model, layout, 2, off, StageConfig(tp_chunks=2))
    assert [p.native for p in plans] == [True, True]
    assert plans[0].describe(StageConfig(tp_chunks=2)) == (
        "stage 0: native tensor-parallel Linear(+ReLU) chain, mp 2, 2 Linear layers, 2 row chunks")
    assert plans[1].describe(StageConfig(recompute=True, tp_chunks=1)) == (
        "stage 1: native tensor-parallel Linear(+ReLU) chain, mp 2, 2 Linear layers, recomputed")
    assert not any(p.native for p in plan_stages(model, layout, 2, off, StageConfig("autograd")))
    custom = plan_stages(model, layout, 2, off, StageConfig(), tp_chains=False)
    assert [p.why for p in custom] == ["tensor-parallel layers of the model's own parallelize function"] * 2
    gelu = nn.Sequential(*[nn.GELU() if isinstance(m, nn.ReLU) else m for m in large_linear_model(16, 2, 0)])
    assert not plan_stages(gelu, [[0, 1, 2, 3]], 2, off, StageConfig())[0].native


def test_stage_config_rejects_a_negative_chunk_count():
    with pytest.raises(ValueError, match="tp_chunks"):
        StageConfig(tp_chunks=-1).validate()


def test_written_trace_holds_the_mp_collectives_as_a_process_of_their_own(tmp_path):
    rows = [[("F", 0, 0, 0.0, 10.0), ("B", 0, 0, 10.0, 30.0)]]
    mp = [[("all_reduce", 1, 2.0, 5.0), ("all_reduce", 2, 12.0, 15.0)]]
    summary = write_trace(str(tmp_path / "t"), rows, "1f1b", 1, 1, comm_rows=[[]], mp_comm_rows=mp)
    assert summary["mp_collectives"] == {"all_reduce": 2} and "dp_collectives" not in summary
    assert comm_rows_of_chrome_trace(str(tmp_path / "t.json"), "mp") == mp
    names = {e["args"]["name"] for e in json.load(open(tmp_path / "t.json"))["traceEvents"] if e["ph"] == "M"}
    assert "MP collectives (thread: pipeline rank)" in names
