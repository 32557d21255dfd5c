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


# What the planner reads of a run (hybrid_engine/planner): the model, the batch and data, the schedule it fills,
# the stages, precision and data-parallel settings it costs, the optimizer's state it counts, the memory cap, the
# device and its card, the cp size (which it ranks unless given) and its K/V transfers. The plan command takes these
# flags alone; the rest (the grid, which it ranks over every dp x pp x mp of --world-size; steps, checkpoints,
# reports) would be ignored, so they are refused.
PLANNING_TABLES = ("model", "data", "schedule", "stages", "precision", "data_parallel")
PLANNING_FIELDS = {"parallel": ("device", "memory_cap_gib", "cp", "cp_comm"), "optimizer": ("name",), "plan": ("card",)}


def applies_to_planning(table: str, name: str) -> bool:
    """Whether field `name` of [table] changes what the planner predicts."""
    return table in PLANNING_TABLES or name in PLANNING_FIELDS.get(table, ())
