"""The run teaches the planner: after MEASURED_STEPS timed steps (past the warm-up), every rank's measurements are
gathered, the cost model is refitted (planner/refit.py), and the engine switches once, in place, to a plan of the
same stages predicted more than 5% faster; rank 0 says which in one line and records it in --metrics."""
from __future__ import annotations

import statistics

import torch.distributed as dist

from hybrid_engine.metrics.trace import comm_spans_of, spans_of
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.refit import MEASURED_STEPS, Refit, Replanner, action_medians, link_rate
from hybrid_engine.planner.run_plan import with_plan


def due(step: int, first_step: int, warmup: int, steps: int) -> bool:
    """Whether the refit runs after `step`: the last of its measured steps, with a step left to run."""
    return step == first_step + warmup + MEASURED_STEPS - 1 and step + 1 < steps


def measurements(times: list[float], engine) -> tuple[float, dict, float | None]:
    """(the slowest rank's median of the measured steps, every traced stage's median action times, the slowest
    rank's DP collective rate), the same on every rank (one all_gather_object)."""
    wire = engine.data_parallel.wire_dtype
    buckets = [b.numel() * (wire.itemsize if wire is not None else b.element_size()) for b in engine.grads.buckets]
    rate = link_rate(comm_spans_of(engine.comm_trace, "dp"), buckets, engine.dp_size)
    mine = (statistics.median(times[-MEASURED_STEPS:]), action_medians(spans_of(engine.trace)), rate)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    actions: dict = {}
    for _, medians, _ in every:
        for key, seconds in medians.items():
            actions[key] = max(seconds, actions.get(key, 0.0))
    rates = [r for *_, r in every if r]
    return max(step for step, _, _ in every), actions, min(rates) if rates else None


def refit_and_switch(replanner: Replanner, cfg, engine, times: list[float], step: int) -> tuple[object, Refit, str]:
    """(cfg with the plan run from the next step; the refit; its line): the engine rescheduled in place when
    the refit says so."""
    measured, actions, dp_rate = measurements(times, engine)
    s = cfg.schedule
    plan = Plan(s.name, s.micro_batches, s.virtual_stages, s.lookahead, s.merge_weight_grads)
    refit = replanner.refit(plan, measured, actions or None, dp_rate)
    line = refit.line(step + 1, f"{MEASURED_STEPS} measured steps" + (" and their traced actions" if actions else ""))
    if refit.switch:
        cfg = with_plan(cfg, refit.best_in_place.plan)
        engine.reschedule(cfg.schedule)
    return cfg, refit, line
