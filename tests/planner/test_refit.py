"""The cost model refitted to a run's measurements (planner/refit.py): the terms it recovers, the switch it
decides, and the engine's in-place reschedule that carries it out (gloo, CPU)."""
from __future__ import annotations

import dataclasses

import pytest

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.config.checks import resolve_grid
from hybrid_engine.config.engine import ScheduleConfig
from hybrid_engine.models import SyntheticRegression, large_linear_model, registry
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.choose import predict
from hybrid_engine.planner.refit import Replanner, fit_terms, link_rate
from hybrid_engine.planner.run_plan import plan_for
from hybrid_engine.planner.step_time import AUTOGRAD_ACTION_S, stage_costs
from hybrid_engine.train.cli import parse_config

# eager: the driver hands the refit the run's chosen --cuda-graphs (graphs.as_chosen), and an eager run's host
# cost a layer is what these tests recover
GPT = ["--model", "gpt", "--hidden", "256", "--layers", "8", "--heads", "4", "--seq-len", "128", "--batch-size", "32",
       "--amp", "bf16", "--cuda-graphs", "off"]


def replanner(flags, pp=2, card=CARDS["h100"], world=None):
    cfg = parse_config(flags + ["--pp", str(pp)])
    grid = resolve_grid(None, pp, cfg.parallel.mp, cfg.parallel.order, world or pp)
    choice = plan_for(cfg, grid, card, "cuda", registry.check_model)
    return Replanner.for_run(cfg, cfg.schedule, grid, "cuda", registry.check_model, choice), choice


def synthetic_actions(r: Replanner, plan: Plan, scale: float, host: float) -> dict:
    """What the run would measure if its compute took `scale` x the table's and each layer action `host` s (the
    model's own prediction under that card: its MP all-reduces unscaled)."""
    card = dataclasses.replace(r.choice.card, compute_scale=scale, host_action_s=host)
    costs = stage_costs(r.shape, card, r.setting, plan)[0]
    return {(st, kind): getattr(costs[st], kind) for st in range(len(costs)) for kind in ("F", "I", "W")}


@pytest.mark.parametrize("mp", [1, 2])
def test_the_traced_actions_give_back_the_compute_scale_and_the_host_cost_per_action(mp):
    r, choice = replanner(GPT + ["--mp", str(mp)], pp=2, world=2 * mp)
    plan = choice.chosen.plan
    measured = synthetic_actions(r, plan, 1.7, 80e-6)
    assert fit_terms(r.shape, r.choice.card, r.setting, plan, measured) == pytest.approx((1.7, 80e-6), rel=1e-6)
    # the refitted card predicts each measured action back (its MP all-reduces at the link's rate)
    fitted = dataclasses.replace(r.choice.card, compute_scale=1.7, host_action_s=80e-6)
    costs = stage_costs(r.shape, fitted, r.setting, plan)[0]
    assert all(getattr(costs[st], kind) == pytest.approx(t, rel=1e-9) for (st, kind), t in measured.items())


def test_the_step_time_alone_fits_the_compute_scale():
    r, choice = replanner(GPT)
    refit = r.refit(choice.chosen.plan, 3 * choice.chosen.step_s)
    assert refit.current.step_s == pytest.approx(3 * choice.chosen.step_s, rel=1e-3)
    assert refit.card.compute_scale > 2 and refit.card.host_action_s is None


def test_a_step_shorter_than_the_tables_host_work_drops_that_guess():
    r, choice = replanner(GPT)
    table = r.choice.card
    # a step that no compute scale reaches with the table's fixed host work a step, and one reaches without it
    least = predict(r.shape, dataclasses.replace(table, compute_scale=1e-3, step_host_s=0.0), r.setting,
                    choice.chosen.plan).step_s
    measured = least + 0.5 * table.step_host_s
    refit = r.refit(choice.chosen.plan, measured)
    assert refit.card.step_host_s == 0.0 and refit.table.step_host_s > 0
    assert refit.current.step_s == pytest.approx(measured, rel=1e-3)


def test_a_host_bound_run_switches_in_place_to_fewer_micro_batches_and_says_so():
    r, _ = replanner(GPT)
    many = Plan("zb1", 8)  # as if the table had chosen it
    refit = r.refit(many, 0.2, synthetic_actions(r, many, 1.0, 2e-3))
    assert refit.switch and refit.best_in_place.plan.micro_batches < 8
    assert refit.best_in_place.plan.virtual_stages == 1  # the same stages: the engine reschedules in place
    line = refit.line(5, "3 measured steps")
    assert line.startswith("planner: refit from 3 measured steps: compute x") and "2000 us a layer action" in line
    assert f"switching to it from step 5 (as flags: {refit.best_in_place.plan.flags()})" in line


def test_a_plan_within_5_percent_is_kept():
    r, choice = replanner(GPT)
    plan = choice.chosen.plan
    table = r.choice.card.action_overhead_s + AUTOGRAD_ACTION_S  # the GPT's stages run through autograd
    refit = r.refit(plan, choice.chosen.step_s, synthetic_actions(r, plan, 1.0, table))
    assert refit.card.compute_scale == pytest.approx(1.0) and refit.card.host_action_s == pytest.approx(table)
    assert not refit.switch and refit.line(5, "x").endswith("no plan is predicted more than 5% faster: keeping it")


def test_the_dp_link_rate_is_the_bytes_moved_over_the_time_in_flight():
    mib = 2**20
    # two buckets' reduce-scatters over 4 ranks, overlapping by 100 us: 3/4 of 8 and 4 MiB moved in 400 us
    spans = [("reduce_scatter", 0, 0.0, 300.0), ("reduce_scatter", 1, 200.0, 400.0), ("all_gather", 0, 0.0, 900.0)]
    assert link_rate(spans, [8 * mib, 4 * mib], 4) == pytest.approx(0.75 * 12 * mib / 400e-6)
    assert link_rate([("all_reduce", 0, 0.0, 100.0)], [mib], 2) == pytest.approx(mib / 100e-6)  # 2 (n - 1) / n
    assert link_rate(spans, [8 * mib, 4 * mib], 1) is None and link_rate([], [mib], 4) is None
    r, choice = replanner(GPT)
    refit = r.refit(choice.chosen.plan, choice.chosen.step_s, dp_rate=1e9)
    assert refit.card.allreduce_bytes_s == 1e9 and "DP collectives at 1 GB/s" in refit.line(5, "x")


def reschedule_ranks(rank: int, world: int) -> dict:
    groups = build_groups(ProcessGrid(1, 2, 1), rank)
    data = SyntheticRegression(16, 0, "cpu")
    out = {}
    for switch in (False, True):
        engine = make_engine(large_linear_model(16, 4, seed=3), groups, schedule="1f1b", micro_batches=4, lr=0.05)
        losses = []
        for step in range(4):
            if switch and step == 2:
                engine.reschedule(ScheduleConfig("zb1", 2, 1, 0, False))
                out["after"] = (engine.micro_batches, sorted({a.type.name for a in engine.actions if a.is_compute}))
            losses.append(engine.train_step(*data.batch(step, 16)).loss)
        if switch:
            try:
                engine.reschedule(ScheduleConfig("interleaved", 4, 2, 0, False))
            except ValueError as exc:
                out["refused"] = str(exc)
        engine.close()
        out[switch] = losses
    groups.destroy()
    return out


def test_the_engine_reschedules_in_place_and_trains_on_from_the_same_state():
    for out in run_ranks(2, reschedule_ranks, timeout=90):
        assert out["after"][0] == 2 and {"I", "W"} <= set(out["after"][1])  # zb1's split backward runs
        # the same state and the same mean gradient: the losses go on as under the first schedule
        assert out[True] == pytest.approx(out[False], rel=1e-5, abs=1e-7)
        assert out["refused"].startswith("reschedule keeps the stages: 2 virtual stages placed loop, not 1")
