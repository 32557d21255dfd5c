"""The run teaches the planner: after MEASURED_STEPS timed steps (past the warm-up), every rank's measurements are
gathered, the cost model is refitted (planner/refit.py), and the engine switches once, in place, to a plan of the
same stages predicted more than 5% faster; rank 0 says which in one line and records it in --metrics."""
from __future__ import annotations

import statistics

import torch.distributed as dist

from hybrid_engine.metrics.trace import spans_of
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.refit import MEASURED_STEPS, Refit, Replanner, action_medians
from hybrid_engine.planner.run_plan import with_plan


def due(step: int, first_step: int, warmup: int, steps: int) -> bool:
    """Whether the refit runs after `step`: the last of its measured steps, with a step left to run."""
    return step == first_step + warmup + MEASURED_STEPS - 1 and step + 1 < steps


def measurements(times: list[float], engine) -> tuple[float, dict]:
    """(the slowest rank's median of the measured steps, every traced stage's median action times), the same on
    every rank (one all_gather_object)."""
    mine = (statistics.median(times[-MEASURED_STEPS:]), action_medians(spans_of(engine.trace)))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    actions: dict = {}
    for _, medians in every:
        for key, seconds in medians.items():
            actions[key] = max(seconds, actions.get(key, 0.0))
    return max(step for step, _ in every), actions


def refit_and_switch(replanner: Replanner, cfg, engine, times: list[float], step: int) -> tuple[object, Refit, str]:
    """(cfg with the plan run from the next step; the refit; its line): the engine rescheduled in place when
    the refit says so."""
    measured, actions = measurements(times, engine)
    s = cfg.schedule
    plan = Plan(s.name, s.micro_batches, s.virtual_stages, s.lookahead, s.merge_weight_grads)
    refit = replanner.refit(plan, measured, actions or None)
    line = refit.line(step + 1, f"{MEASURED_STEPS} measured steps" + (" and their traced actions" if actions else ""))
    if refit.switch:
        cfg = with_plan(cfg, refit.best_in_place.plan)
        engine.reschedule(cfg.schedule)
    return cfg, refit, line
