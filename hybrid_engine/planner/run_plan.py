"""The planner for a run: what the schedule flags leave to auto, filled with the plan `choose` picks for the run's
model on its grid and card; pure computation on what every rank reads alike (the flags, the model's shape, the
card's table entry), so every rank plans the same without a collective."""
from __future__ import annotations

import dataclasses
from typing import Callable

from hybrid_engine.config.engine import ConfigError, ScheduleConfig

from .candidates import Plan, Request
from .card import GIB, Card, this_device
from .choose import Choice, NoPlanFits, choose
from .context import context_hint
from .model_shape import ModelShape, shape_of
from .setting import Setting


def run_cap(cfg, card: Card) -> float:
    """The memory a rank of the run may use: --memory-cap-gib, else the card's (the plan's choice, the plan
    command's table and auto's CUDA graphs are all held to it)."""
    return cfg.parallel.memory_cap_gib * GIB if cfg.parallel.memory_cap_gib is not None else card.memory_bytes


def with_plan(cfg, plan: Plan):
    """cfg (a RunConfig) running `plan`."""
    return dataclasses.replace(cfg, schedule=ScheduleConfig(plan.schedule, plan.micro_batches, plan.virtual_stages,
                                                            plan.lookahead, plan.merge_wgrad))


def legality(cfg, world_size: int, device_type: str, model_rules: Callable) -> Callable[[Plan], bool]:
    """plan -> whether the run's own checks (RunConfig.validate) accept cfg with that plan; the model's rules
    asked once per virtual-stage count (a decoder's read its data file's header)."""
    answers: dict[int, ConfigError | None] = {}

    def rules_once(c, grid, dt):
        v = c.schedule.virtual_stages
        if v not in answers:
            try:
                model_rules(c, grid, dt)
                answers[v] = None
            except ConfigError as exc:
                answers[v] = exc
        if answers[v] is not None:
            raise answers[v]

    def legal(plan: Plan) -> bool:
        try:
            with_plan(cfg, plan).validate(world_size, device_type, rules_once)
        except ConfigError as exc:
            legal.first_error = getattr(legal, "first_error", None) or str(exc)
            return False
        return True

    return legal


def plan_for(cfg, grid, card: Card, device_type: str, model_rules: Callable,
             shape: ModelShape | None = None) -> Choice:
    """The choice for cfg on `grid` and `card`, keeping every schedule field cfg fixes; NoPlanFits when none fits."""
    shape = shape or shape_of(cfg)
    setting = Setting.of(cfg, grid.dp_size, grid.pp_size, grid.mp_size)
    return choose(shape, card, setting, Request.of(cfg.schedule),
                  legality(cfg, grid.world_size, device_type, model_rules), run_cap(cfg, card))


def plan_run(cfg, grid, device_type: str, model_rules: Callable) -> tuple[object, Choice]:
    """(cfg with every auto schedule field filled, the choice): a plan that fits nothing is one ConfigError line,
    before any collective."""
    card = this_device(cfg.plan.card, device_type)
    try:
        choice = plan_for(cfg, grid, card, device_type, model_rules)
    except NoPlanFits as exc:
        hint = context_hint(cfg, grid, plan_for, card, device_type, model_rules)
        raise ConfigError(f"planner: {exc}{hint}") from None
    return with_plan(cfg, choice.chosen.plan), choice


def compare_text(measured_s: float, predicted_s: float, measured_gib: float, predicted_gib: float) -> str:
    """'step 10.3 ms (predicted 9.8, +5%), peak 21.9 GiB (predicted 21.3)': the run against its plan."""
    off = (measured_s / predicted_s - 1) * 100 if predicted_s > 0 else 0.0
    return (f"step {measured_s * 1e3:.3g} ms (predicted {predicted_s * 1e3:.3g}, {off:+.0f}%), "
            f"peak {measured_gib:.3g} GiB (predicted {predicted_gib:.3g})")
