"""The planner's choice from injected card tables (independent of this machine), its memory cap, and its legality."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from hybrid_engine.config.checks import resolve_grid
from hybrid_engine.models import registry
from hybrid_engine.planner import CARDS, NoPlanFits, Request, choose
from hybrid_engine.planner.card import GIB
from hybrid_engine.models.mlp.workload import mlp_shape
from hybrid_engine.planner.run_plan import legality, plan_for
from hybrid_engine.planner.setting import Setting
from hybrid_engine.train.cli import parse_config


def plan_of(flags: list[str], world: int, card=CARDS["h200"], cap=None):
    cfg = parse_config(flags)
    if cap is not None:
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, memory_cap_gib=cap))
    p = cfg.parallel
    grid = resolve_grid(p.dp, p.pp, p.mp, p.order, world)
    return plan_for(cfg, grid, card, "cuda", registry.check_model)


L = ["--dim", "8192", "--depth", "16", "--batch-size", "1024", "--amp", "bf16"]


def test_large_mlp_layers_on_a_pipeline_merge_their_weight_gradients():
    choice = plan_of(L + ["--pp", "2"], 2)
    # zbv: ZB-H1's split backward on the V, with less bubble in the simulator (docs/schedules.md)
    assert choice.chosen.plan.schedule == "zbv" and choice.chosen.plan.merge_wgrad
    assert choice.runner_up is not None and choice.runner_up.step_s > choice.chosen.step_s


PLAN_ONE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                        "results", "2026-11-27-1xH200-plan-one.json")
MEMORY_POINTS = os.path.join(os.path.dirname(PLAN_ONE), "2026-11-27-1xH200-memory-points.json")


@pytest.mark.parametrize("config, flags", [("L", L[:-2] + ["--amp", "fp16"]),
                                           ("C", ["--dim", "8192", "--depth", "8", "--batch-size", "64",
                                                  "--amp", "fp16"])])
def test_one_gpu_mlp_plan_matches_the_measured_step_within_a_fifth(config, flags):
    """The plan the planner chooses now, against that plan run on one H200 with no schedule flags
    (experiments/passes/plan_pass.sh): measurements the H200 card's rates were not fitted to (those are the GEMM,
    copy and P2P rates of experiments/results/2026-11-26-2xH200.json, planner/card.py)."""
    with open(PLAN_ONE) as f:
        measured = json.load(f)["runs"][f"{config}_auto"]
    with open(MEMORY_POINTS) as f:  # the same plan's peak, measured on the engine as it builds stages now
        peak = json.load(f)["runs"][f"{config}_1f1b_m1"]["peak_mem_gib"]
    c = plan_of(flags + ["--cuda-graphs", "off"], 1)  # measured before the stages were graphed
    assert c.chosen.plan.flags() == measured["plan"], (c.chosen.plan.flags(), measured["plan"])
    assert measured["plan"].startswith("--schedule 1f1b --micro-batches 1 ")
    assert abs(c.chosen.step_s / measured["step_time_s"] - 1) < 0.2, (c.chosen.step_s, measured["step_time_s"])
    assert abs(c.chosen.peak / GIB / peak - 1) < 0.2


def test_gpt_never_merges_weight_gradients_for_no_speed():
    gpt = ["--model", "gpt", "--hidden", "256", "--layers", "8", "--heads", "4", "--seq-len", "128",
           "--batch-size", "32", "--amp", "bf16", "--pp", "4"]
    choice = plan_of(gpt, 4)
    assert not choice.chosen.plan.merge_wgrad


def test_explicit_flags_are_kept():
    choice = plan_of(L + ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "8"], 2)
    assert {(p.plan.schedule, p.plan.micro_batches) for p in choice.ranked} == {("1f1b", 8)}
    choice = plan_of(L + ["--pp", "2", "--no-merge-wgrad"], 2)
    assert not any(p.plan.merge_wgrad for p in choice.ranked)


def test_a_plan_never_exceeds_the_memory_cap():
    free = plan_of(L + ["--pp", "2"], 2)
    cap = usable_fraction_cap(free.chosen.needed) / GIB * 0.999  # the unconstrained choice no longer fits
    capped = plan_of(L + ["--pp", "2"], 2, cap=cap)
    assert capped.chosen.peak <= cap * GIB
    assert all(p.peak <= cap * GIB for p in capped.ranked)
    # a plan is set aside when what it needs (its peak, the allocator's overhead) is within 3% of the cap or over
    assert all(p.needed <= 0.97 * cap * GIB for p in capped.ranked)
    assert all(p.needed > 0.97 * cap * GIB for p in capped.over_cap)
    assert capped.chosen.plan != free.chosen.plan


def usable_fraction_cap(needed: float) -> float:
    """The cap under which a plan needing `needed` bytes is just taken (3% of the cap kept free)."""
    return needed / 0.97


def test_nothing_fits_is_one_line():
    with pytest.raises(NoPlanFits, match=r"no plan fits 0\.1 GiB per rank: the smallest, .* needs") as info:
        plan_of(L, 1, cap=0.1)
    assert "\n" not in str(info.value)


def test_every_plan_is_legal_for_the_grid():
    cfg = parse_config(["--dim", "64", "--depth", "6", "--batch-size", "24", "--pp", "2"])  # the Setting's grid
    grid = resolve_grid(None, 2, 1, cfg.parallel.order, 2)
    legal = legality(cfg, 2, "cpu", registry.check_model)
    choice = choose(mlp_shape(64, 6), CARDS["h100"], Setting(1, 2, 1, 24), Request(), legal)
    assert choice.ranked
    for p in choice.ranked:
        assert 24 % p.plan.micro_batches == 0
        assert 6 % 1 == 0 and 2 * p.plan.virtual_stages <= 6  # depth 6 holds pp x v stages
        cfg_p = dataclasses.replace(cfg, schedule=dataclasses.replace(
            cfg.schedule, name=p.plan.schedule, micro_batches=p.plan.micro_batches,
            virtual_stages=p.plan.virtual_stages, lookahead=p.plan.lookahead, merge_weight_grads=p.plan.merge_wgrad))
        cfg_p.validate(2, "cpu", registry.check_model)  # raises if not legal
    assert grid.pp_size == 2


def test_cpu_keeps_the_reference_plan_and_the_nearest_legal_count():
    assert plan_of(["--pp", "2"], 2, card=CARDS["cpu"]).chosen.plan.describe() == "1f1b, 4 micro-batches"
    assert plan_of(["--batch-size", "6"], 1, card=CARDS["cpu"]).chosen.plan.micro_batches == 3


def test_a_cheaper_injected_card_changes_the_choice_deterministically():
    slow_memory = dataclasses.replace(CARDS["h200"], hbm_bytes_s=1e11)
    a, b = plan_of(L, 1, card=slow_memory), plan_of(L, 1, card=slow_memory)
    assert a.chosen.plan == b.chosen.plan and a.chosen.step_s == b.chosen.step_s
    assert a.line().startswith("plan: ") and "predicted" in a.line() and "runner-up" in a.line()
