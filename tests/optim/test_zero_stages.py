"""ZeRO-2 and ZeRO-3 (hybrid_engine/optim/zero.py): gradients, then parameters too, sharded over the data-parallel
ranks. Every grid and schedule family trains the single-process model (fp32, CPU, relative 1e-5), with
recomputation, hybrid sharding and prefetch depths; a rank holds its shard of gradients and parameters (within the
bucket padding); the trace draws the gathers inside the step; checkpoints move between zero levels and grids
exactly. Few launches: every case of one world size runs in the same processes."""
from __future__ import annotations

import pytest
import torch

from dist_utils import run_ranks
from engine_reference import reference_run
from hybrid_engine.models import SyntheticRegression, large_linear_model
from zero_ranks import overflow_runs, resume_runs, save_runs, train_runs

# batch 96: 4 micro-batches x dp <= 4 equal slices; a small bucket cap gives several buckets whose shards cut
# layers mid-tensor
CFG = dict(dim=32, depth=8, batch_size=96, micro_batches=4, steps=3, lr=0.05, bucket_mb=0.004)
PP_SCHEDULES = [("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb1", 1)]
WORLD4 = (
    [dict(dp=4, zero=2, stage_impl="autograd"), dict(dp=4, zero=3)]
    + [dict(dp=4, zero=3, shard_size=2, stage_impl="autograd", prefetch=2),  # hybrid: 2 copies of 2 shards
       dict(dp=4, zero=2, shard_size=2, clip=0.05), dict(dp=4, zero=0, clip=0.05), dict(dp=2, pp=2, zero=3, clip=0.05)]
    # every schedule family on dp2 x pp2, each at zero 2 and zero 3
    + [dict(dp=2, pp=2, zero=z, schedule=s, v=v) for s, v in PP_SCHEDULES for z in (2, 3)]
    + [dict(dp=2, pp=2, zero=3, schedule="zb1", merge=True),
       dict(dp=2, pp=2, zero=3, schedule="1f1b", recompute=True, stage_impl="autograd"),
       dict(dp=2, mp=2, zero=2), dict(dp=2, mp=2, zero=3, recompute=True)]
)
WORLD2 = [dict(dp=2, zero=z, stage_impl=impl, evaluate=True) for z in (2, 3) for impl in ("auto", "autograd")] + [
    dict(dp=2, zero=3, recompute=True, stage_impl="autograd", prefetch=3)]
WORLD8 = [dict(dp=2, pp=2, mp=2, zero=2, schedule="interleaved", v=2), dict(dp=2, pp=2, mp=2, zero=3)]


@pytest.fixture(scope="module")
def reference():
    return reference_run(CFG["dim"], CFG["depth"], CFG["batch_size"], CFG["micro_batches"], CFG["steps"], CFG["lr"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check_matches_reference(world: int, runs: list[dict], results: list, reference) -> None:
    ref_losses, ref_state = reference
    for index, run in enumerate(runs):
        state = {}
        for r in range(world):
            assert results[r][index]["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, r)
            state.update({k: torch.from_numpy(v) for k, v in results[r][index]["state"].items()})
        assert set(state) == set(ref_state), run
        assert max(_rel(state[k], ref_state[k]) for k in ref_state) < 1e-5, run


def test_zero3_without_a_pipeline_holds_a_few_buckets_during_the_forward():
    """dp2, autograd, prefetch 1: as each layer starts its forward a rank holds its pieces and at most the bucket
    it reads, the one prefetched and the one the previous layer released after its forward (8 one-layer buckets)."""
    runs = [dict(dp=2, zero=3, stage_impl="autograd")]
    for (out,) in run_ranks(2, train_runs, runs, CFG, timeout=120):
        params, _ = out["whole"]
        bucket = params / out["buckets"]  # every bucket one equal layer
        assert params / 2 + 2 * bucket <= out["held"]["in_forward"] <= params / 2 + 3 * bucket + 4 * 2 * 8


@pytest.fixture(scope="module")
def world4():
    return run_ranks(4, train_runs, WORLD4, CFG, timeout=300)


def test_zero2_and_zero3_on_four_ranks_match_one_process(world4, reference):
    """dp4 (hybrid too), dp2 x pp2 under every schedule family, merged W, recompute, dp2 x mp2."""
    clipped = [i for i, run in enumerate(WORLD4) if run.get("clip")]
    replicated = next(i for i in clipped if WORLD4[i]["zero"] == 0)
    for i in clipped:  # each element counted once over the shards of one copy: the replicated run's norm and curve
        for r in range(4):
            assert world4[r][i]["norms"] == pytest.approx(world4[r][replicated]["norms"], rel=1e-5), WORLD4[i]
            assert world4[r][i]["losses"] == pytest.approx(world4[r][replicated]["losses"], rel=1e-5), WORLD4[i]
        assert all(n > 0.05 for n in world4[0][i]["norms"])  # the clipping acted
    unclipped = [run for run in WORLD4 if not run.get("clip")]
    results = [[out for run, out in zip(WORLD4, per_rank) if not run.get("clip")] for per_rank in world4]
    _check_matches_reference(4, unclipped, results, reference)


def test_a_rank_holds_its_shard_of_parameters_and_gradients(world4):
    """dp4: after the backward and after the step, zero 2 holds 1/4 of the gradient (the buckets released once
    reduce-scattered) and zero 3 also 1/4 of the parameters; a hybrid copy of 2 shards holds 1/2. As the step's
    first layer starts, no gradient bucket exists yet (each comes back at its first write). Within the padding of
    every bucket to a multiple of the shard count."""
    for index, run in enumerate(WORLD4[:3]):
        shards = run.get("shard_size") or run["dp"]
        for per_rank in world4:
            out = per_rank[index]
            params, grads = out["whole"]
            pad = 4 * shards * out["buckets"]  # fp32: at most shards - 1 padding elements per bucket
            # (a native chain's layers run no Python hooks to look from)
            autograd = run.get("stage_impl") == "autograd"
            for when in ("after_backward", "after_step") + (("step_start",) if autograd else ()):
                held_params, held_grads = out["held"][when]
                assert params / shards <= held_grads <= params / shards + pad, (run, when)
                if when == "step_start":
                    continue  # the first buckets' parameters are being gathered then
                if run["zero"] == 3:
                    assert params / shards <= held_params <= params / shards + pad, (run, when)
                else:
                    assert held_params >= params, (run, when)


def test_zero2_and_zero3_on_two_and_eight_ranks_match_one_process(reference):
    """dp2 through the native chains and autograd (a deeper prefetch, recompute), and an evaluation after the
    training (ZeRO-3 gathers every bucket for it); dp2 x pp2 x tp2."""
    world2 = run_ranks(2, train_runs, WORLD2, CFG, timeout=300)
    _check_matches_reference(2, WORLD2, world2, reference)
    model = large_linear_model(CFG["dim"], CFG["depth"], 0, device="cpu")
    model.load_state_dict(reference[1])
    x, y = SyntheticRegression(CFG["dim"], 0, "cpu").batch(0, CFG["batch_size"])
    want = float(torch.nn.functional.mse_loss(model(x), y))
    for index, run in enumerate(WORLD2):
        if run.get("evaluate"):
            assert all(out[index]["evaluated"] == pytest.approx(want, rel=1e-5) for out in world2), run
    _check_matches_reference(8, WORLD8, run_ranks(8, train_runs, WORLD8, CFG, timeout=300), reference)


def test_the_trace_draws_zero3_gathers_and_zero2_reductions_inside_the_step():
    """ZeRO-3 without a pipeline, autograd: every bucket gathered for each micro-batch's forward and again for its
    backward (released after each); through the native chain, once for the step. ZeRO-2 without a pipeline: every
    bucket reduced after each micro-batch's backward. All beside the step's compute: only what the step's start
    launched precedes it."""
    runs = [dict(dp=2, zero=3, stage_impl="autograd", trace=True), dict(dp=2, zero=3, trace=True),
            dict(dp=2, zero=2, trace=True)]
    for per_rank in run_ranks(2, train_runs, runs, CFG, timeout=120):
        resharded, kept, zero2 = per_rank
        m, n = CFG["micro_batches"], resharded["buckets"]
        # the first layer's bucket (packed last): its input has no gradient to release it after the backward, so
        # it stays for the next micro-batch's forward
        for out, times in ((resharded, [2 * m] * (n - 1) + [m + 1]), (kept, [1] * n)):
            gathers = [(b, start) for kind, b, start, _ in out["comm"] if kind == "all_gather"]
            assert sorted(b for b, _ in gathers) == [b for b in range(n) for _ in range(times[b])]
            before = [b for b, start in gathers if start < 0]
            assert len(before) <= (1 if out is resharded else out["buckets"]), before  # prefetch 1 / native: all
        reduces = sorted(b for kind, b, _, _ in zero2["comm"] if kind == "all_reduce")  # gloo: no reduce-scatter
        assert reduces == [b for b in range(zero2["buckets"]) for _ in range(m)]


RESUME_CFG = dict(CFG, steps=4)
SAVED = [dict(dp=2, pp=2, zero=3, optimizer="adam"), dict(dp=4, zero=2, shard_size=2, optimizer="adam")]
RESUMED = [dict(dp=4, zero=2, optimizer="adam"), dict(dp=2, mp=2, zero=3, optimizer="adam")]


def test_checkpoints_move_between_zero_levels_and_grids_exactly():
    """Saved at zero 3 on dp2 x pp2, resumed at zero 2 on dp4; saved by a hybrid zero 2, resumed at zero 3 on
    dp2 x mp2 (Adam: the moments move with the weights); on one rank at zero 0, both."""
    first = 2
    saved_per_rank = run_ranks(4, save_runs, SAVED, RESUME_CFG, first, timeout=300)
    saved = []
    for index in range(len(SAVED)):  # every rank's stages, joined
        weights, optimizer = {}, {}
        for per_rank in saved_per_rank:
            weights.update(per_rank[index]["weights"])
            optimizer.update(per_rank[index]["optimizer"])
        saved.append({"weights": weights, "optimizer": optimizer})
    straight = [saved_per_rank[0][i]["losses"] for i in range(len(SAVED))]
    for world, runs in ((4, RESUMED), (1, [dict(dp=1, zero=0, optimizer="adam")] * 2)):
        for per_rank in run_ranks(world, resume_runs, runs, saved, RESUME_CFG, first, timeout=300):
            for index, losses in enumerate(per_rank):
                assert losses == pytest.approx(straight[index][first:], rel=1e-5), (runs[index], world)


def test_an_overflow_in_one_shard_skips_the_step_on_every_rank_at_zero_2_and_3():
    for per_rank in run_ranks(2, overflow_runs, [2, 3], dict(CFG, steps=4), 1, 2, timeout=120):
        for history in per_rank:
            assert [skipped for skipped, _, _ in history] == [False, False, True, False], history
            assert [unchanged for _, _, unchanged in history] == [False, False, True, False], history
            assert history[3][1] == history[2][1] / 2  # the scale backed off
