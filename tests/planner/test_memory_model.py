"""The planner's memory model against measured peaks (torch.cuda.max_memory_allocated): within 10% over and never
more than 3% under each; the plans that ran out of memory refused on the card they ran on; every ZeRO level, the
shard group, context parallelism and recompute move it the way their definitions say."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hybrid_engine.models import registry
from hybrid_engine.planner import CARDS, Request, choose
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.card import GIB
from hybrid_engine.planner.choose import predict
from hybrid_engine.planner.memory import CAP_MARGIN, DYNAMIC_OVERHEAD, REDUCING_BUCKETS, fits, peak_bytes
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.run_plan import legality
from hybrid_engine.planner.setting import Setting
from hybrid_engine.train.cli import parse_config
from plan_flags import plan_of

LLAMA_8B = ["--model", "llama", "--hidden", "4096", "--layers", "32", "--heads", "32", "--kv-heads", "8",
            "--ffn-hidden", "14336", "--seq-len", "4096", "--vocab-size", "128256", "--batch-size", "16", "--amp",
            "bf16", "--optimizer", "adamw"]
# The zero-sharding runs' kernels (their logs: "fused kernels on ... RMSNorm, RoPE, SwiGLU, chunked linear +
# cross-entropy"); --fused-kernels auto on this CPU-only machine would leave them off.
LLAMA_8B_FUSED = LLAMA_8B + ["--fused-kernels", "on"]
LLAMA_8B_H200 = LLAMA_8B + ["--plan-card", "h200"]  # auto's kernels on the H200 (elementwise unfused under tp)
LLAMA_1B = ["--model", "llama", "--hidden", "2048", "--layers", "16", "--heads", "32", "--kv-heads", "8",
            "--ffn-hidden", "5632", "--seq-len", "2048", "--vocab-size", "32000", "--batch-size", "16", "--amp",
            "bf16", "--optimizer", "adamw"]
GPT_1B = ["--model", "gpt", "--hidden", "2048", "--layers", "16", "--heads", "16", "--seq-len", "2048", "--batch-size",
          "16", "--amp", "bf16"]  # on a 32000-token vocabulary (experiments/passes/plan_pass.sh)
H100, H200 = CARDS["h100"], CARDS["h200"]


@pytest.fixture(autouse=True)
def gpt_vocabulary(monkeypatch):
    monkeypatch.setattr("hybrid_engine.models.gpt.workload.data_vocab", lambda path, seq_len: 32000)


def predicted(flags, grid, plan, card=H200, **setting):
    # eager stages, as every point here was measured (graphed stages' memory: tests/planner/test_graphs_plan.py)
    cfg = parse_config(flags + ["--cuda-graphs", "off"])
    s = dataclasses.replace(Setting.of(cfg, *grid), **setting)
    return predict(shape_of(cfg), card, s, plan)


# (model, grid dp x pp x mp, the plan the planner chose for it, ZeRO, peak GiB). Measured on 4 x H200
# (experiments/results/2026-11-27-4xH200-zero-sharding.json): the 8B at dp4, zero 1, 2 and 3. Derived from peaks
# measured while a stage was still built in float32 and that copy kept (experiments/NOTES.md, "Twelfth session"):
# the peak less the copy, 4 bytes x the rank's stage parameters (unsplit) -- the 8B's pp4 and pp2 x tp2 (NOTES.md;
# the issue tables), the Llama-1B's (2026-11-27-{1xH200-llama-1gpu,4xH200-llama-4gpu}.json) and the GPT-1B's
# (2026-11-27-{1xH200-plan-one,4xH200-plan-four}.json, on a 32000-token vocabulary). The 8B's three plans that ran
# out of memory on 4 x H100 80 GB, again on 4 x H200 under --memory-cap-gib 78 with the kernels auto gives there
# (2026-11-28-4xH200-zero-sharding-h100-plans.json; the first rank's peak; --mp, which that choice reads).
MEASURED = [
    (LLAMA_8B_H200, (1, 4, 1), Plan("interleaved", 16, 4), 0, 59.77),
    (LLAMA_8B_H200 + ["--mp", "2"], (1, 2, 2), Plan("interleaved", 8, 4), 0, 65.96),
    (LLAMA_8B_H200 + ["--mp", "4"], (1, 1, 4), Plan("1f1b", 8), 0, 51.23),
    (LLAMA_8B_FUSED, (4, 1, 1), Plan("1f1b", 4), 1, 89.94),
    (LLAMA_8B_FUSED, (4, 1, 1), Plan("1f1b", 4), 2, 69.62),
    (LLAMA_8B_FUSED, (4, 1, 1), Plan("1f1b", 4), 3, 59.49),
    (LLAMA_8B, (1, 4, 1), Plan("interleaved", 8, 4), 0, 89.54),
    (LLAMA_8B, (1, 2, 2), Plan("interleaved", 4, 4), 0, 96.43),
    (LLAMA_1B, (1, 1, 1), Plan("1f1b", 8), 0, 20.08),
    (LLAMA_1B, (1, 1, 1), Plan("1f1b", 4), 0, 25.78),
    (LLAMA_1B, (1, 2, 2), Plan("1f1b", 8), 0, 7.20),
    (LLAMA_1B, (1, 2, 2), Plan("zb1", 8, merge_wgrad=True), 0, 15.13),
    (GPT_1B, (1, 1, 1), Plan("1f1b", 1), 0, 57.89),
    (GPT_1B, (1, 1, 1), Plan("1f1b", 4), 0, 26.35),
    (GPT_1B, (1, 1, 1), Plan("1f1b", 8), 0, 21.10),
    (GPT_1B, (4, 1, 1), Plan("1f1b", 1), 0, 26.35),
    (GPT_1B, (1, 4, 1), Plan("1f1b", 8, lookahead=1), 0, 9.79),
    (GPT_1B, (1, 4, 1), Plan("interleaved", 8, 2), 0, 10.43),
    (GPT_1B, (1, 4, 1), Plan("interleaved", 4, 4), 0, 13.98),
]
# merged W keeps every micro-batch's GEMM inputs: the GPT's stash is overestimated (safe, not yet within 10%)
OVER = [(GPT_1B, (1, 1, 1), Plan("zb1", 4, merge_wgrad=True), 0, 52.0),
        (GPT_1B, (1, 4, 1), Plan("zb1", 8, 1, 1, True), 0, 15.02)]


@pytest.mark.parametrize("flags, grid, plan, zero, measured", MEASURED)
def test_the_peak_is_within_10_percent_over_and_3_under_each_measured_point(flags, grid, plan, zero, measured):
    peak = predicted(flags, grid, plan, zero=zero).peak / GIB
    assert -0.03 <= peak / measured - 1 <= 0.10, (peak, measured)


@pytest.mark.parametrize("flags, grid, plan, zero, measured", OVER)
def test_never_more_than_3_percent_under_where_not_yet_within_10(flags, grid, plan, zero, measured):
    assert predicted(flags, grid, plan, zero=zero).peak / GIB >= 0.97 * measured


@pytest.mark.parametrize("zero, ran", [(1, False), (2, True), (3, True)])
def test_under_a_78_gib_cap_the_8b_at_dp4_is_taken_at_the_zero_levels_that_ran_there(zero, ran):
    """4 x H200 under --memory-cap-gib 78 (2026-11-27-4xH200-zero-sharding.json): zero 2 and 3 trained (69.6 and
    59.5 GiB allocated at most); zero 1 needs 89.9 GiB, measured without the cap."""
    p = predicted(LLAMA_8B_FUSED, (4, 1, 1), Plan("1f1b", 4), zero=zero)
    assert p.fits(78 * GIB) == ran, (p.peak / GIB, p.needed / GIB)


@pytest.mark.parametrize("grid, plan", [((4, 1, 1), Plan("1f1b", 4)), ((1, 4, 1), Plan("interleaved", 8, 4)),
                                        ((1, 2, 2), Plan("interleaved", 4, 4))])
def test_every_8b_plan_that_ran_on_a_140_gib_card_is_taken_there(grid, plan):
    assert predicted(LLAMA_8B, grid, plan, zero=1 if grid[0] > 1 else 0).fits(H200.memory_bytes)


@pytest.mark.parametrize("run, grid, plan, zero", [("plan_auto", (2, 2, 1), Plan("interleaved", 8, 4), 1),
                                                   ("zero2", (4, 1, 1), Plan("1f1b", 4), 2)])
def test_the_allocators_share_covers_what_the_8b_reserved_beyond_its_allocated_peak(run, grid, plan, zero):
    """torch.cuda.max_memory_reserved less max_memory_allocated of the 8B's runs under a 78 GiB cap (the first job of
    2026-11-27-4xH200-zero-sharding-plans.json; the first pipeline stage's ranks hold both maxima): within the share of
    the predicted per-step bytes the planner adds, and not far below it."""
    measured = json.loads((RESULTS / "2026-11-27-4xH200-zero-sharding-plans.json").read_text())["jobs"][0]["runs"][run]
    cfg = parse_config(LLAMA_8B_FUSED)
    first = peak_bytes(shape_of(cfg), dataclasses.replace(Setting.of(cfg, *grid), zero=zero), plan,
                       H200.workspace_bytes)[0]
    reserved_beyond = (measured["reserved_gib"] - measured["peak_gib"]) * GIB
    assert 0.7 * DYNAMIC_OVERHEAD * first.dynamic <= reserved_beyond <= DYNAMIC_OVERHEAD * first.dynamic


def test_on_80_gb_the_8b_at_dp4_is_refused_under_zero_1_and_fits_under_zero_3():
    cfg = parse_config(LLAMA_8B_FUSED + ["--dp", "4", "--zero", "1"])
    shape, legal = shape_of(cfg), legality(cfg, 4, "cuda", registry.check_model)

    def plan_at(zero):
        return choose(shape, H100, dataclasses.replace(Setting.of(cfg, 4, 1, 1), zero=zero), Request(), legal)

    with pytest.raises(ValueError, match=r"no plan fits 79\.1 GiB per rank: the smallest, .* needs 89\.\d GiB"):
        plan_at(1)
    three = plan_at(3)
    assert three.chosen.needed <= (1 - CAP_MARGIN) * H100.memory_bytes
    assert three.chosen.peak / GIB < 0.7 * 89.94  # the measured zero 1 peak (zero 3 measured 59.49: 66% of it)


def test_each_zero_level_shards_more_and_a_smaller_shard_group_less():
    one = Plan("1f1b", 4)
    peaks = [predicted(LLAMA_8B, (4, 1, 1), one, zero=z).peak for z in range(4)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 4
    layers = shape_of(parse_config(LLAMA_8B)).layers
    params = sum(layer.params for layer in layers)
    # zero 1 -> 2: the fp32 gradients sharded over 4, less the buckets held whole (one filling, two reducing): each
    # of the 8B's layers holds more than a 256 MiB bucket, so the LM head's and the last two blocks' buckets
    assert REDUCING_BUCKETS == 3 and min(4 * layer.params for layer in layers[1:]) > 256 * 2**20
    whole = 4 * (layers[-1].params + layers[-2].params + layers[-3].params)
    assert peaks[1] - peaks[2] == pytest.approx(params * 4 * 3 / 4 - whole, rel=1e-6)
    hybrid, alone = (predicted(LLAMA_8B, (4, 1, 1), one, zero=3, zero_shard=n).peak for n in (2, 1))
    assert peaks[3] < hybrid < alone


def test_zero_3_under_a_pipeline_keeps_its_stage_gathered():
    plan = Plan("1f1b", 4)
    alone = predicted(LLAMA_8B, (2, 2, 1), plan, zero=3).ranks[0]
    two = predicted(LLAMA_8B, (2, 2, 1), plan, zero=2).ranks[0]
    # the gathered half weights (2 bytes a parameter) come back, the sharded half weights go
    assert alone.dynamic > two.dynamic and alone.static < two.static


def test_context_parallelism_splits_the_activations_and_recompute_drops_them():
    plan = Plan("1f1b", 4)
    whole = predicted(LLAMA_1B, (1, 1, 1), plan).ranks[0]
    halved = predicted(LLAMA_1B + ["--cp", "2"], (1, 1, 1), plan).ranks[0]  # one cp rank's share of the shape
    assert halved.static == whole.static and halved.dynamic == pytest.approx(whole.dynamic / 2, rel=0.01)
    # whole stages recomputed: stage 0 of pp4 keeps 4 micro-batches' inputs and rebuilds one chain, not 4 chains
    kept = predicted(LLAMA_1B, (1, 4, 1), Plan("1f1b", 8)).ranks[0]
    recomputed = predicted(LLAMA_1B, (1, 4, 1), Plan("1f1b", 8), full_recompute=True).ranks[0]
    assert recomputed.dynamic < 0.4 * kept.dynamic


def test_the_schedule_sets_the_activations_in_flight():
    one_f_one_b = predicted(LLAMA_1B, (1, 4, 1), Plan("1f1b", 8)).ranks[0]
    gpipe = predicted(LLAMA_1B, (1, 4, 1), Plan("gpipe", 8)).ranks[0]
    assert gpipe.dynamic > 1.8 * one_f_one_b.dynamic  # 8 micro-batches in flight on stage 0 against 4


def test_a_plan_within_3_percent_of_the_cap_is_not_taken():
    p = predicted(LLAMA_1B, (1, 1, 1), Plan("1f1b", 8))
    assert fits(list(p.ranks), p.needed / (1 - CAP_MARGIN))
    assert not fits(list(p.ranks), p.needed / (1 - CAP_MARGIN) * 0.999)
    assert not fits(list(p.ranks), p.needed * 1.02)  # 2% of room is not enough


RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
MLP = {"L": ["--dim", "8192", "--depth", "16", "--batch-size", "1024", "--amp", "fp16"],
       "C": ["--dim", "8192", "--depth", "8", "--batch-size", "64", "--amp", "fp16"]}


def _float32_copy_gib(flags: list[str], pp: int) -> float:
    """What a pipeline rank of the MLP (equal layers) held when its stage was built in float32 and that copy kept:
    4 bytes a parameter of its 1/pp of the model."""
    params = sum(layer.params for layer in shape_of(parse_config(flags)).layers)
    return 4 * params / pp / GIB


def mlp_runs():
    """One GPU: measured (2026-11-27-1xH200-memory-points.json). pp4: the peaks of 2026-11-27-4xH200-plan-four.json,
    measured while each stage kept a float32 copy of itself, less that copy (on one GPU the same subtraction gives
    the re-measured peaks to the MiB: experiments/NOTES.md, "Twelfth session")."""
    points = json.loads((RESULTS / "2026-11-27-1xH200-memory-points.json").read_text())["runs"]
    for run, r in points.items():
        if run[0] in MLP:
            yield pytest.param(MLP[run[0]], (1, 1, 1), plan_of(r["flags"].split()), r["peak_mem_gib"], id=f"{run}-1")
    for run, r in json.loads((RESULTS / "2026-11-27-4xH200-plan-four.json").read_text())["runs"].items():
        if run[0] in MLP:
            peak = r["peak_mem_gib"] - _float32_copy_gib(MLP[run[0]], 4)
            yield pytest.param(MLP[run[0]], (1, 4, 1), plan_of(r["plan"].split()), peak, id=f"{run}-4")


@pytest.mark.parametrize("flags, grid, plan, measured", list(mlp_runs()))
def test_every_measured_mlp_peak_is_within_10_percent_over_and_3_under(flags, grid, plan, measured):
    peak = predicted(flags, grid, plan).peak / GIB
    assert -0.03 <= peak / measured - 1 <= 0.10, (peak, measured)


def test_the_fused_kernels_peak_and_saving_as_measured():
    """The Llama-1B shape with the fused kernels off and on (2026-11-27-1xH200-kernels-1b.json: 8 micro-batches of
    2 sequences of 2048), each peak less the float32 copy of the stage its tree kept: the chunked loss keeps its
    input's gradient and the head's fp32 weight gradient instead of the logits, the fused SwiGLU gate and up;
    what they save within 15% of the 1.03 GiB measured."""
    peaks = json.loads((RESULTS / "2026-11-27-1xH200-kernels-1b.json").read_text())["peak_gib"]
    params = sum(layer.params for layer in shape_of(parse_config(LLAMA_1B)).layers)
    measured = {k: peaks[f"fused_kernels_{k}"] - 4 * params / GIB for k in ("off", "on")}
    peak = {k: predicted(LLAMA_1B + ["--fused-kernels", k], (1, 1, 1), Plan("1f1b", 8)).peak / GIB
            for k in ("off", "on")}
    for k in ("off", "on"):
        assert -0.03 <= peak[k] / measured[k] - 1 <= 0.10, (k, peak[k], measured[k])
    saved, measured_saved = peak["off"] - peak["on"], measured["off"] - measured["on"]
    assert abs(saved / measured_saved - 1) <= 0.15, (saved, measured_saved)


def test_sequence_parallelism_splits_the_norms_inputs_and_keeps_their_gathered_outputs():
    """Per block and token, 4 h elements whole without it (each RMSNorm's input and output); with it each input is
    a sequence chunk and the output is kept gathered by the projection after it: 2 h / mp + 2 h. At mp 2, h of
    2048: 2048 elements a token and block less, on what a micro-batch keeps and one block's backward beside it."""
    plan, tokens = Plan("1f1b", 4), 4 * 2048
    whole, split = (predicted(LLAMA_1B + flag, (1, 1, 2), plan).ranks[0].dynamic
                    for flag in ([], ["--sequence-parallel"]))
    assert whole - split == pytest.approx((16 + 1) * 2048 * 2 * tokens, rel=1e-6)


@pytest.mark.parametrize("zero, run", [(1, "zero1_uncapped"), (2, "zero2"), (3, "zero3")])
def test_the_8b_step_at_dp4_is_predicted_within_15_percent_at_each_zero_level(zero, run):
    """4 x H200, 4 micro-batches, every fusion on as those runs had it (2026-11-27-4xH200-zero-sharding.json): zero
    2 and 3 reduce-scatter after every micro-batch, and zero 3 gathers twice a micro-batch, none of it hidden."""
    measured = json.loads((RESULTS / "2026-11-27-4xH200-zero-sharding.json").read_text())["runs"][run]
    step_s = 16 * 4096 / measured["tokens_s"]  # the batch's tokens over the rate
    p = predicted(LLAMA_8B + ["--fused-kernels", "on"], (4, 1, 1), Plan("1f1b", 4), zero=zero)
    assert abs(p.step_s / step_s - 1) <= 0.15, (p.step_s, step_s)


def test_fp8_counts_its_weight_cache_and_keeps_the_projections_inputs_in_fp8():
    """The 8B shape cut to 4 layers on one GPU, 8 micro-batches of 2 sequences: --fp8 keeps 2 bytes a block GEMM
    weight parameter through the step (the weight cache; none with --fp8-weight-cache off, or by auto under ZeRO-3)
    and, per block and token, (q + ffn) / 2 elements fewer (the out and down projections' inputs kept for dw in
    fp8), on the micro-batch in flight and on one block's backward beside it."""
    flags = list(LLAMA_8B_FUSED)
    flags[flags.index("--layers") + 1] = "4"
    plan, tokens, layers = Plan("1f1b", 8), 2 * 4096, 4
    bf16, cached, uncached = (predicted(flags + extra, (1, 1, 1), plan).ranks[0]
                              for extra in ([], ["--fp8"], ["--fp8", "--fp8-weight-cache", "off"]))
    block_weights = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336
    assert cached.static - bf16.static == pytest.approx(2 * layers * block_weights, rel=1e-9)
    assert uncached.static == bf16.static and uncached.dynamic == cached.dynamic
    assert bf16.dynamic - cached.dynamic == pytest.approx((layers + 1) * (4096 + 14336) / 2 * 2 * tokens, rel=1e-9)
    zero3 = [predicted(flags + ["--zero", "3"] + extra, (2, 1, 1), plan).ranks[0].static for extra in ([], ["--fp8"])]
    assert zero3[0] == zero3[1]


# CUDA-graphed runs, against the most their allocator reserved on any rank (a graph's pool holds its blocks through
# the run, which shows as reserved memory, not allocated): the Llama-1B class on one GPU, tp4, pp4 and pp2 x tp2
# (2026-11-28-1xH200-llama-1gpu-graphed-peers.json, 2026-11-28-4xH200-graphs-llama-auto.json), the GPT at pp4
# (2026-11-28-4xH200-pp4-schedules-graphs-auto.json; zbv: ...-pp4-schedules-zbv-graphed.json), the 8B's plan for a
# 78 GiB card on the H200s' own memory (2026-11-28-4xH200-zero-sharding-plan-graphed-uncapped.json) and one GPU at
# 64k tokens (2026-11-28-4xH200-long-seq-one-gpu-64k-graphed.json), each run's peak_reserved_gib in its logs; the
# Llama at tp2 and pp2 and the GPT at pp2, each pool measured (2026-11-28-2xH200-graph-pools.json, whose probe
# found the pp4 and tp4 runs' reserved peaks again within 1%: 2026-11-28-4xH200-graph-pools.json).
GPT_PP4 = ["--model", "gpt", "--hidden", "2560", "--layers", "12", "--heads", "20", "--seq-len", "1024", "--batch-size",
           "32", "--amp", "bf16", "--optimizer", "adamw", "--split-blocks", "off"]  # its runs' stages: whole blocks
LLAMA_64K = ["--model", "llama", "--hidden", "2048", "--layers", "16", "--heads", "32", "--kv-heads", "8",
             "--ffn-hidden", "5632", "--seq-len", "65536", "--vocab-size", "32000", "--batch-size", "1", "--amp", "bf16",
             "--optimizer", "adamw", "--rope-theta", "500000", "--max-positions", "131072"]
GRAPHED = {
    "llama_1gpu": (LLAMA_1B, (1, 1, 1), Plan("1f1b", 8), 0, 19.521),
    "llama_tp4": (LLAMA_1B + ["--mp", "4"], (1, 1, 4), Plan("1f1b", 8), 0, 6.334),
    "llama_pp4": (LLAMA_1B, (1, 4, 1), Plan("1f1b", 8), 0, 8.82),
    "llama_pp2tp2": (LLAMA_1B + ["--mp", "2"], (1, 2, 2), Plan("1f1b", 8), 0, 7.805),
    "gpt_pp4_1f1b": (GPT_PP4, (1, 4, 1), Plan("1f1b", 8), 0, 10.514),
    "gpt_pp4_interleaved_v2": (GPT_PP4, (1, 4, 1), Plan("interleaved", 8, 2), 0, 13.205),
    "gpt_pp4_interleaved_v3": (GPT_PP4, (1, 4, 1), Plan("interleaved", 8, 3), 0, 15.615),
    "llama8b_dp2pp2": (LLAMA_8B, (2, 2, 1), Plan("interleaved", 8, 4), 1, 81.947),
    "llama_64k": (LLAMA_64K, (1, 1, 1), Plan("1f1b", 1), 0, 80.109),
    "gpt_pp4_zbv": (GPT_PP4, (1, 4, 1), Plan("zbv", 8, 2), 0, 14.758),
    "llama_tp2": (LLAMA_1B + ["--mp", "2"], (1, 1, 2), Plan("1f1b", 8), 0, 10.781),
    "llama_pp2": (LLAMA_1B, (1, 2, 1), Plan("1f1b", 8), 0, 13.014),
    "gpt_pp2_1f1b": (GPT_PP4, (1, 2, 1), Plan("1f1b", 8), 0, 14.387),
    "gpt_pp2_interleaved_v2": (GPT_PP4, (1, 2, 1), Plan("interleaved", 8, 2), 0, 17.521),
    "gpt_pp2_interleaved_v3": (GPT_PP4, (1, 2, 1), Plan("interleaved", 8, 3), 0, 18.723),
}
# peak within 10% over and 3% under, but for these (why):
GRAPHED_OFF = {
    "llama_tp4": "7% under (0.45 GiB; 2026-11-28-4xH200-graph-pools.json): the forward pool holds the 2.11 GiB of "
                 "activations counted but reserves 2.20 (each 11 MiB block a 12 MiB segment), the backward pool "
                 "0.18 against 0.15; the general pool 0.32 beyond the weights, their companions and two cuBLAS "
                 "workspaces: 0.16 free inside its segments, 0.13 allocated by what the probe did not name (none "
                 "such on the Llama's pipeline ranks)",
}


def predicted_graphed(flags, grid, plan, zero):
    cfg = parse_config(flags + ["--plan-card", "h200", "--cuda-graphs", "on"])
    return predict(shape_of(cfg), H200, dataclasses.replace(Setting.of(cfg, *grid), zero=zero), plan)


@pytest.mark.parametrize("run", sorted(GRAPHED))
def test_a_graphed_plan_is_held_to_more_than_it_reserved(run):
    """What the planner holds a plan to under a cap (its peak and the allocator's share) covers what the graphed run
    reserved: a plan taken under a cap the run could not fit in is the failure this guards against."""
    flags, grid, plan, zero, reserved = GRAPHED[run]
    assert predicted_graphed(flags, grid, plan, zero).needed / GIB >= reserved


@pytest.mark.parametrize("run", sorted(GRAPHED))
def test_a_graphed_peak_is_within_10_percent_over_and_3_under_or_named(run):
    flags, grid, plan, zero, reserved = GRAPHED[run]
    error = predicted_graphed(flags, grid, plan, zero).peak / GIB / reserved - 1
    assert (-0.03 <= error <= 0.10) != (run in GRAPHED_OFF), (run, error)
