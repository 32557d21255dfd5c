"""The planner's step time against every measured GPU step whose plan is known (measured_steps.py: the MLP's L and C
on every grid, the GPT-1B (on H200s and H100s) and the Llama-1B shapes on theirs, the plan pass's sweeps, the engine
A/B's new tree, the 8B at dp4): the same plan on the same grid of the same cards predicted within 15% of the measured
median, except the known misses below, each still a miss (so that the list is kept honest when the model improves)."""
from __future__ import annotations

import pytest

from hybrid_engine.config.checks import resolve_grid
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.choose import predict
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from hybrid_engine.train.cli import parse_config
from measured_steps import card_of, measured_steps
from plan_flags import plan_of

TOLERANCE = 0.15
_MLP_TREE = ("the grids pass's tree (grids-mlp) ran the native chain on several GPUs far slower than the plan "
             "pass's tree a session later: L at pp4, zb1 + merged W x 8, 13.3 ms there and 7.2 ms in "
             "plan-four.json, which is predicted within 15%")
_LLAMA_FUSED_TP = ("the Llama at pp2 x tp2 with its RMSNorm, RoPE and SwiGLU as compiled regions (the A/B tree's "
                   "default then; --fused-kernels auto now leaves them unfused under tp, as the model plans it): "
                   "306 and 345 ms against the unfused runs' 266 and 288, a compiled call's host cost the model "
                   "does not have")
_H100_EAGER_DP = ("the MLP's eager DP grids on 4 x H100 run 16-18% over the prediction while the same grids graphed "
                  "(their gradient collectives after the replay, exposed in the model too) are within 10%: the eager "
                  "backward hides less of the collectives than the model credits")
_H100_MP4 = ("L at mp4 on 4 x H100: predicted 18-21% slow, graphed or not, where its pp2 x mp2 points are within 3%: "
             "four-way all-reduces of 16 MiB measured faster than the card's link rate gives")
_FP8 = ("--fp8, measured before the quantization's reuse and the weight cache: each GEMM then quantized both of its "
        "operands from scratch and the weights every micro-batch, where this tree quantizes each once, and the model "
        "(planner/fp8_time.py) does not time: 1277 and 1326 ms (1.28 and 1.33 x bf16's 999) against 870 and 929 "
        "predicted, -32% and -30%")
KNOWN_MISSES = {
    ("4xH100-graphs", "C_dp4pp1mp1_m1_off"): _H100_EAGER_DP,
    ("4xH100-graphs", "C_dp2pp2mp1_m4_off"): _H100_EAGER_DP,
    ("4xH100-graphs", "L_dp2pp2mp1_m4_off"): _H100_EAGER_DP,
    ("4xH100-graphs", "L_dp1pp1mp4_m1_off"): _H100_MP4,
    ("4xH100-graphs", "L_dp1pp1mp4_m1_on"): _H100_MP4,
    ("4xH100-graphs", "C_dp1pp1mp4_m1_off"): ("C at mp4 eager on 4 x H100: 3.53 ms against 3.00 predicted (-15.1%), "
                                               "as config C's mp4 on H200s (C_mp4 above)"),
    ("4xH100-graphs", "C_dp1pp1mp4_m1_on"): ("C at mp4 graphed: 1.94 ms against 2.87 predicted (+48%); the model keeps "
                                              "the tensor-parallel all-reduces' per-collective wait inside a replay "
                                              "that launches them without the host"),
    ("4xH200-graphs-llama", "pp2tp2_off"): ("the Llama-1B class at pp2 x tp2, eager, 8 micro-batches of 4096 tokens: "
                                            "the host floor (counted operators x 16 us) predicts 267 ms against 219 "
                                            "measured (+22%), where tp4 of the same job is within 10%; this plan "
                                            "measured 209 to 288 ms across the earlier passes"),
    ("4xH200-graphs-llama", "tp4_on"): ("the same model graphed at tp4: 219 ms predicted against 190 (+15.2%); "
                                        "as C at mp4 graphed, the model keeps each tensor-parallel all-reduce's wait "
                                        "for the slowest rank inside a replay that launches them without the host"),
    ("4xH200-graphs-llama-auto", "tp4_on"): "the same run graphed by auto in a later job: 219 ms against 190 (+15.0%)",
    ("4xH200-graphs-llama-auto", "tp4_off"): ("the Llama-1B class at tp4 eager in a later job: 484 ms predicted against "
                                              "388 (+25%); the same plan measured 443 and 507 ms in earlier jobs, and "
                                              "the host floor is fitted between them"),
    # (results file, run): why it is left out. Predicted fast unless said.
    ("4xH100-kernels-8b-pp4", "llama8b_fp8_tensorwise"): _FP8,
    ("4xH100-kernels-8b-pp4", "llama8b_fp8_rowwise"): _FP8,
    ("4xH200-grids-mlp", "C_dp2mp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "C_dp2pp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "C_pp2mp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "C_pp4"): _MLP_TREE,
    ("4xH200-grids-mlp", "L_dp2mp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "L_dp2pp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "L_pp2mp2"): _MLP_TREE,
    ("4xH200-grids-mlp", "L_pp4"): _MLP_TREE,
    ("4xH200-grids-mlp", "C_mp4"): ("config C at mp4 measured slower than at mp2 (3.6 against 2.8 ms) while L at "
                                    "mp4 is faster than at mp2: an MP synchronisation that fits C's mp4 puts L's "
                                    "over"),
    ("4xH200-grids-mlp", "L_mp4"): "predicted slow: the other side of C_mp4",
    ("4xH200-grids-gpt", "gpt_dp4"): ("one 1024-token sequence a micro-batch on the grids pass's tree: host-bound "
                                      "beyond the cost per action the GPT-1B's 1, 4 and 8 micro-batches measure"),
    ("4xH200-grids-gpt", "gpt_dp2tp2"): "as gpt_dp4: two sequences a micro-batch, on the grids pass's tree",
    ("4xH200-llama-4gpu", "llama_pp2tp2_sp"): ("sequence parallelism on the Llama under tp: 350 ms against 286 "
                                               "predicted (267 without it, measured 241): its blocks are "
                                               "host-paced, and the floor counts their aten operators on no group, "
                                               "without the host work of the collectives that sequence "
                                               "parallelism doubles and their slab copies"),
    ("2xH100-gpt-pp-tp", "engine_tp2_sp"): ("measured on the tree whose sequence-parallel collectives were Python "
                                            "autograd functions over list-form collectives (~250 us of host time "
                                            "each, 1,056 a step: experiments/NOTES.md, sixth session); the flat "
                                            "C++ form this model times came after"),
    ("4xH200-engine-ab-llama-fused-on", "pp2tp2"): _LLAMA_FUSED_TP,
    ("4xH200-engine-ab-llama-fused-on", "pp2tp2_2"): _LLAMA_FUSED_TP,
    ("4xH200-plan-four", "C_pp4_auto"): ("config C at pp4 with one micro-batch: 2.45 ms, host-bound sends and "
                                         "receives of 64 rows (-16%)"),
    ("4xH200-plan-four", "C_pp4_zb1merged_m8"): ("5.5 ms at 8 micro-batches of 8 rows against 2.6 at 4 of 16 (which "
                                                 "fits): a cost of the smallest GEMMs the model does not have"),
}


@pytest.fixture(autouse=True)
def gpt_vocabulary(monkeypatch):
    """The GPT takes its vocabulary from its data: the passes' token files hold 32000 tokens."""
    monkeypatch.setattr("hybrid_engine.models.gpt.workload.data_vocab", lambda path, seq_len: 32000)


def predicted_ms(flags: list[str], ranks: int, card: str) -> float:
    """The step predicted for the run, planned for the card it ran on (its kernels as they were resolved there)."""
    cfg = parse_config(flags if "--plan-card" in flags else flags + ["--plan-card", card])
    p = cfg.parallel
    grid = resolve_grid(p.dp, p.pp, p.mp, p.order, ranks)
    s = Setting.of(cfg, grid.dp_size, grid.pp_size, grid.mp_size)
    return predict(shape_of(cfg), CARDS[card], s, plan_of(flags)).step_s * 1e3


def points(known: bool):
    for name, run, flags, ranks, step_ms in measured_steps():
        if ((name, run) in KNOWN_MISSES) == known:
            yield pytest.param(flags, ranks, card_of(name), step_ms, id=f"{name}:{run}")


def test_every_file_and_grid_is_read():
    ids = {(name, run) for name, run, *_ in measured_steps()}
    assert len(ids) == 193 and set(KNOWN_MISSES) <= ids
    assert {name for name, _ in ids} == {
        "4xH200-grids-mlp", "4xH200-grids-gpt", "2xH100-gpt-pp-tp", "2xH200-gpt-dp", "4xH200-llama-4gpu",
        "1xH200-llama-1gpu", "1xH200-plan-one",
        "4xH200-plan-four", "4xH200-engine-ab-llama", "4xH200-engine-ab-gpt", "4xH200-engine-ab-gpt-pp2tp2-repeat",
        "4xH200-engine-ab-gpt-fused-on", "4xH200-engine-ab-llama-fused-on", "2xH200-engine-ab-gpt-tp2",
        "4xH200-zero-sharding", "4xH200-zero-sharding-plans", "4xH100-graphs", "4xH100-pp4-schedules",
        "4xH100-kernels-8b-pp4", "4xH200-kernels-8b-pp4-fp8-reuse", "4xH200-kernels-8b-pp4-fp8-kernels",
        "2xH200-transformer-step-head-ab", "4xH200-zero-sharding-plan-head", "4xH200-pp4-schedules",
        "4xH200-zero-sharding-h100-plans", "4xH200-graphs-llama", "4xH200-graphs-llama-auto",
        "1xH200-llama-1gpu-graphed-peers", "4xH200-pp4-schedules-graphs-auto", "4xH200-pp4-schedules-zbv-graphed",
        "4xH200-zero-sharding-plan-graphed-uncapped", "4xH200-zero-sharding-plan-auto-cap",
        "4xH200-pp4-schedules-split-blocks", "4xH200-graphs-llama-split-blocks"}
    tp4_m2 = next(p for p in points(False) if p.id == "4xH200-grids-gpt:gpt_tp4_m2")
    assert tp4_m2.values[0].count("--micro-batches") == 1 and tp4_m2.values[3] == 159.2  # the last value given


@pytest.mark.parametrize("flags, ranks, card, step_ms", list(points(known=False)))
def test_the_step_is_predicted_within_15_percent(flags, ranks, card, step_ms):
    predicted = predicted_ms(flags, ranks, card)
    assert abs(predicted / step_ms - 1) <= TOLERANCE, (predicted, step_ms)


@pytest.mark.parametrize("flags, ranks, card, step_ms", list(points(known=True)))
def test_a_known_miss_is_still_a_miss(flags, ranks, card, step_ms):
    predicted = predicted_ms(flags, ranks, card)
    assert abs(predicted / step_ms - 1) > TOLERANCE, (predicted, step_ms)
