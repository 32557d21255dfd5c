"""The planner's own settings: which card it models and whether the run stops after planning
(hybrid_engine/planner; docs/planning.md)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .fields import flag

PLAN_CARDS = ("auto", "h100", "h200", "cpu")  # hybrid_engine/planner/card.py holds each one's numbers


@dataclass(frozen=True)
class PlanConfig:
    """How the engine plans what the schedule flags leave to auto (hybrid_engine/planner)."""

    only: bool = field(default=False, metadata=flag("--plan-only"))
    """Print the planner's ranked table of grids and plans for this world size and model, then exit 0 without
    training (no process group is made)."""
    card: str = field(default="auto", metadata=flag("--plan-card", choices=PLAN_CARDS))
    """The device the planner models: auto (this one: an H100 or H200 from its table, else a CPU estimate, which
    keeps the plan nearest 1f1b x 4 micro-batches); h100, h200 or cpu: that one's numbers, on any machine."""
