"""DP gradient all-reduce overlapped with the backward (csrc/executor/dp_grad_sync.h).

Gradients live in several size-capped buckets, packed in reverse layer order; during a stage's last gradient
action the fused chain and the W flush announce each gradient as it becomes final, and a bucket's all-reduce
starts as soon as all of it is announced. These tests check, on dp=2 gloo ranks, that the buckets really start
during the backward (not all at its end), on every rank in the same order, each exactly once, and that the
trained model is still the plain-PyTorch one (relative 1e-5, as the grid-invariance tests).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dist_utils import run_ranks
from engine_reference import reference_run
from hybrid_engine import ProcessGrid
from engine_builders import make_engine
from hybrid_engine.engine.engine import Engine
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.parallel.tensor.layers import Linear

# One layer of dim 64 is 64*64 + 64 fp32 values = 16.25 KiB: a 0.02 MiB cap gives one bucket per layer.
CFG = dict(dim=64, depth=8, batch_size=64, micro_batches=4, steps=3, lr=0.05, bucket_mb=0.02)


def _bucket_layout(engine: Engine) -> dict:
    """How the buckets cover the gradients: `tiled` (every bucket is exactly the disjoint union of its
    gradients, every gradient in one bucket) and, per stage, the layer indices each bucket holds."""
    spans = {}
    for b, flat in enumerate(engine.grads.buckets):
        start = flat.data_ptr()
        spans[b] = (start, start + flat.numel() * flat.element_size())
    stepped = dict(zip(map(id, engine.parameters), engine.optimized))
    covered = {b: 0 for b in spans}
    layers = {s: {b: set() for b in bs} for s, bs in engine._stage_buckets.items()}
    tiled = True
    for s in engine.stage_ids:
        for name, param in engine.stages[s].named_parameters():
            grad = stepped[id(param)].grad
            lo, hi = grad.data_ptr(), grad.data_ptr() + grad.numel() * grad.element_size()
            owners = [b for b, (a, z) in spans.items() if a <= lo and hi <= z]
            tiled &= len(owners) == 1 and owners[0] in engine._stage_buckets[s]
            if owners:
                covered[owners[0]] += hi - lo
                layers[s][owners[0]].add(engine.stage_layer_indices[s][int(name.partition(".")[0])])
    tiled &= all(covered[b] == z - a for b, (a, z) in spans.items())
    return {"tiled": tiled, "layers": {s: {b: sorted(v) for b, v in m.items()} for s, m in layers.items()}}


def overlap_runs(rank: int, world: int, runs: list[tuple], cfg: dict) -> list[dict]:
    out = []
    for dp, pp, schedule, v, options in runs:
        grid = ProcessGrid(dp, pp, 1)
        groups = build_groups(grid, rank)
        engine = make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups, schedule=schedule,
                             micro_batches=cfg["micro_batches"], virtual_stages=v, lr=cfg["lr"],
                             dp_bucket_mb=cfg["bucket_mb"], **options)
        data = SyntheticRegression(cfg["dim"], 0, "cpu")
        per_dp = cfg["batch_size"] // dp
        d = groups.coords.dp
        losses, launches = [], []
        for step in range(cfg["steps"]):
            x, y = data.batch(step, cfg["batch_size"], d * per_dp, (d + 1) * per_dp)
            losses.append(engine.train_step(x, y).loss)
            launches.append(engine._executor.dp_sync.last_step_launches())
        state = {k: t.numpy() for k, t in engine.full_state_dict().items()}
        out.append({"pp_rank": groups.coords.pp, "dp_rank": d, "losses": losses, "launches": launches,
                    "num_buckets": len(engine.grads.buckets), "layout": _bucket_layout(engine),
                    "state": state if d == 0 else {}})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def reference():
    return reference_run(CFG["dim"], CFG["depth"], CFG["batch_size"], CFG["micro_batches"], CFG["steps"], CFG["lr"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check_run(per_rank: list[dict], run: tuple, reference, *, min_notified_missing: int | None) -> None:
    """Model equals the reference; every step launches each bucket once, in the same order on both DP
    replicas; with min_notified_missing = k, all but at most k buckets per rank started by announcement."""
    ref_losses, ref_state = reference
    state = {}
    for out in per_rank:
        assert out["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, out["losses"])
        assert out["layout"]["tiled"], (run, "buckets must cover every gradient exactly once")
        state.update({k: torch.from_numpy(t) for k, t in out["state"].items()})
        n = out["num_buckets"]
        for step, launches in enumerate(out["launches"]):
            assert sorted(b for b, _ in launches) == list(range(n)), (run, step, launches)
            notified = sum(cause == "notified" for _, cause in launches)
            if min_notified_missing is None:
                assert notified == 0, (run, step, launches)
            else:
                assert notified >= n - min_notified_missing, (run, step, launches)
    assert set(state) == set(ref_state), run
    worst = max(_rel(state[k], ref_state[k]) for k in ref_state)
    assert worst < 1e-5, (run, worst)
    # The DP replicas of one pipeline rank must start the same all-reduces in the same order (else: a hang).
    by_pp: dict[int, list] = {}
    for out in per_rank:
        by_pp.setdefault(out["pp_rank"], []).append(out["launches"])
    for pp_rank, replicas in by_pp.items():
        order = [[[b for b, _ in step] for step in launches] for launches in replicas]
        assert all(o == order[0] for o in order), (run, pp_rank, replicas)


def test_dp2_buckets_launch_during_the_backward(reference):
    runs = [(2, 1, "1f1b", 1, {}),
            (2, 1, "zb1", 1, {"merge_weight_grads": True}),
            (2, 1, "zb1", 1, {})]
    results = run_ranks(2, overlap_runs, runs, CFG, timeout=120)
    for index, run in enumerate(runs):
        per_rank = [results[r][index] for r in range(2)]
        assert all(out["num_buckets"] == CFG["depth"] for out in per_rank), run
        # Reverse layer order: bucket 0 holds the last layer, the one backward finishes first.
        assert per_rank[0]["layout"]["layers"][0] == {b: [2 * (CFG["depth"] - 1 - b)] for b in range(CFG["depth"])}
        _check_run(per_rank, run, reference, min_notified_missing=1)
        # Launched in completion order = bucket order, one by one, as the backward walks down the layers.
        for out in per_rank:
            assert [b for b, _ in out["launches"][-1]][:CFG["depth"] - 1] == list(range(CFG["depth"] - 1)), run


def test_dp2_autograd_stages_launch_during_the_backward_too(reference):
    """Module-by-module autograd announces each gradient from its post-accumulate hook (fp32: autograd wrote it
    into the bucket), so buckets start during the stage's last backward, in bucket order, as the fused chain's
    do; the model is still right."""
    runs = [(2, 1, "1f1b", 1, {"stage_impl": "autograd"})]
    results = run_ranks(2, overlap_runs, runs, CFG, timeout=120)
    per_rank = [results[r][0] for r in range(2)]
    _check_run(per_rank, runs[0], reference, min_notified_missing=1)
    for out in per_rank:
        assert [b for b, _ in out["launches"][-1]][:CFG["depth"] - 1] == list(range(CFG["depth"] - 1))


def test_dp2_autograd_stages_with_half_weights_announce_their_main_grads():
    """bf16 half weights: hybrid::linear writes each weight's fp32 main grad itself and announces it from C++;
    the buckets still start during the backward, in the same order on both replicas (the losses are bf16's, so
    only the launches are checked here)."""
    runs = [(2, 1, "1f1b", 1, {"stage_impl": "autograd", "amp": "bf16"})]
    results = run_ranks(2, overlap_runs, runs, CFG, timeout=120)
    per_rank = [results[r][0] for r in range(2)]
    for out in per_rank:
        n = out["num_buckets"]
        for launches in out["launches"]:
            assert sorted(b for b, _ in launches) == list(range(n))
            assert sum(cause == "notified" for _, cause in launches) >= n - 1, launches
    assert per_rank[0]["launches"] == per_rank[1]["launches"]


def test_dp2_pp2_several_buckets_per_stage(reference):
    """Pipelines: each stage's buckets start during that stage's own last gradient action (interleaved: two
    stages per rank, each with its own buckets)."""
    runs = [(2, 2, "1f1b", 1, {}),
            (2, 2, "zb1", 1, {"merge_weight_grads": True}),
            (2, 2, "interleaved", 2, {})]
    results = run_ranks(4, overlap_runs, runs, CFG, timeout=180)
    for index, run in enumerate(runs):
        per_rank = [results[r][index] for r in range(4)]
        for out in per_rank:
            layers = out["layout"]["layers"]
            assert all(len(held) == 1 for buckets in layers.values() for held in buckets.values()), run
        _check_run(per_rank, run, reference, min_notified_missing=1)


def test_default_cap_keeps_one_bucket_for_a_small_model(reference):
    runs = [(2, 1, "1f1b", 1, {})]
    results = run_ranks(2, overlap_runs, runs, dict(CFG, bucket_mb=256), timeout=120)
    per_rank = [results[r][0] for r in range(2)]
    assert all(out["num_buckets"] == 1 for out in per_rank)
    _check_run(per_rank, runs[0], reference, min_notified_missing=0)



def _tied_model(dim: int) -> torch.nn.Sequential:
    """Three layers whose first and last are the same Linear: its gradient is written twice per backward,
    and is final only after the second write (the chain's layer 0)."""
    torch.manual_seed(7)
    shared, middle = Linear(dim, dim), Linear(dim, dim)
    return torch.nn.Sequential(shared, torch.nn.ReLU(), middle, torch.nn.ReLU(), shared)


def _tied_data(cfg: dict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(cfg["batch_size"], cfg["dim"], generator=gen), torch.randn(cfg["batch_size"], cfg["dim"],
                                                                                  generator=gen)


def tied_run(rank: int, world: int, cfg: dict) -> dict:
    groups = build_groups(ProcessGrid(world, 1, 1), rank)
    engine = make_engine(_tied_model(cfg["dim"]), groups, schedule="1f1b", micro_batches=cfg["micro_batches"],
                         lr=cfg["lr"], dp_bucket_mb=cfg["bucket_mb"])
    per_dp = cfg["batch_size"] // world
    launches = []
    for step in range(cfg["steps"]):
        x, y = _tied_data(cfg, step)
        engine.train_step(x[rank * per_dp:(rank + 1) * per_dp], y[rank * per_dp:(rank + 1) * per_dp])
        launches.append(engine._executor.dp_sync.last_step_launches())
    out = {"launches": launches, "num_buckets": len(engine.grads.buckets),
           "state": {k: p.detach().numpy().copy() for k, p in engine.stages[0].state_dict().items()}}
    engine.close()
    groups.destroy()
    return out


def test_a_gradient_written_twice_in_the_backward_starts_only_after_its_last_write():
    cfg = dict(CFG, steps=3)
    reference = _tied_model(cfg["dim"])
    opt = torch.optim.SGD(reference.parameters(), lr=cfg["lr"])
    for step in range(cfg["steps"]):
        x, y = _tied_data(cfg, step)
        opt.zero_grad()
        for xm, ym in zip(x.chunk(cfg["micro_batches"]), y.chunk(cfg["micro_batches"])):
            (F.mse_loss(reference(xm), ym) / cfg["micro_batches"]).backward()
        opt.step()
    results = run_ranks(2, tied_run, cfg, timeout=120)
    for out in results:
        assert out["num_buckets"] == 2  # [middle], [shared]: the tied layer once
        for launches in out["launches"]:
            assert launches == [(0, "notified"), (1, "notified")], launches
        for name, want in reference.state_dict().items():
            assert _rel(torch.from_numpy(out["state"][name]), want) < 1e-5, name
