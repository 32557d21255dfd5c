"""Pipeline schedules as data: the Python face of the C++ schedule core (csrc/schedule/).

A schedule is one list of :class:`Action` per pipeline rank, e.g. ``[[0F0, 0SEND_F0, ...], [1RECV_F0, 1F0, ...]]``.
Stage ``s`` (a global virtual-stage index, ``0 .. pp * v - 1``) runs on the rank its schedule's placement gives
(:func:`stage_rank`, csrc/schedule/placement.h: ``loop`` for every schedule here, ``v`` for V-shaped ones). The
executor runs a rank's list literally; :func:`simulate` dry-runs all lists together with costs per action.

`python -m hybrid_engine.schedule` prints, simulates and draws one (hybrid_engine/schedule.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

import hybrid_engine._C as _C

_core = _C.schedule

Action = _core.Action
ActionType = _core.ActionType
Costs = _core.Costs
SimResult = _core.SimResult
TimedAction = _core.TimedAction
ScheduleDeadlockError = _core.ScheduleDeadlockError

SCHEDULES: tuple[str, ...] = tuple(_core.schedule_names())
PLACEMENTS: tuple[str, ...] = tuple(_core.placement_names())

# The one stage -> rank map (csrc/schedule/placement.h): stage_rank(stage, pp, num_stages, placement) and
# rank_stages(rank, pp, num_stages, placement), the stages a rank holds, ascending.
stage_rank = _core.stage_rank
rank_stages = _core.rank_stages
schedule_placement = _core.schedule_placement

Schedule = list[list[Action]]
# One row per rank of (start, end, type, stage, micro): the input of hybrid_engine.metrics.timeline.draw_timeline.
TimelineRows = list[list[tuple[float, float, str, int, int]]]

__all__ = [
    "Action", "ActionType", "Costs", "SimResult", "TimedAction", "ScheduleDeadlockError", "SCHEDULES", "PLACEMENTS",
    "stage_rank", "rank_stages", "schedule_placement",
    "make_schedule", "compute_schedule", "add_communication", "validate", "simulate", "num_stages_of",
    "format_grid", "timeline_rows",
]


def make_schedule(name: str, pp: int, micro_batches: int, virtual_stages: int = 1, lookahead: int = 0) -> Schedule:
    """The program each rank executes (compute and communication). Raises ValueError for a bad request.
    lookahead (1f1b, zb1): forwards every rank but the last runs beyond the 1F1B warm-up, to cover the
    gradient's round trip (csrc/schedule/generators.cpp)."""
    return _core.make_schedule(name, pp, micro_batches, virtual_stages, lookahead)


def compute_schedule(name: str, pp: int, micro_batches: int, virtual_stages: int = 1, lookahead: int = 0
                     ) -> Schedule:
    """The compute-only program (F, B, I, W) of each rank, before add_communication."""
    return _core.make_compute_schedule(name, pp, micro_batches, virtual_stages, lookahead)


def num_stages_of(schedule: Sequence[Sequence[Action]]) -> int:
    """Stages the schedule covers: one more than the largest stage index it names."""
    return 1 + max((a.stage for actions in schedule for a in actions), default=0)


def add_communication(schedule: Schedule, num_stages: Optional[int] = None, placement: str = "loop") -> Schedule:
    """Insert sends right after their producer and receives one compute ahead of their consumer."""
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    return _core.add_communication(schedule, len(schedule), stages, placement)


def validate(schedule: Schedule, micro_batches: Optional[int] = None, num_stages: Optional[int] = None,
             placement: str = "loop") -> None:
    """Raise ValueError naming the rank and the action of the first structural problem (see validate.h)."""
    if micro_batches is None:
        micro_batches = 1 + max((a.micro for actions in schedule for a in actions), default=0)
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    _core.validate(schedule, len(schedule), stages, micro_batches, placement)


def simulate(schedule: Schedule, costs: Optional[Costs] = None, num_stages: Optional[int] = None,
             stage_costs: Optional[list[Costs]] = None, placement: str = "loop") -> SimResult:
    """Dry-run all ranks. Costs are per action (one stage, one micro-batch); default F=1, B=2, I=1, W=1.
    stage_costs: one Costs per stage, used for that stage's actions instead (latency stays costs').
    placement: the schedule's (schedule_placement(name)), which rank runs which stage.

    Raises ValueError for a malformed schedule and ScheduleDeadlockError (a RuntimeError) naming the stuck
    action of every rank when no rank can progress.
    """
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    return _core.simulate(schedule, len(schedule), stages, costs if costs is not None else Costs(), stage_costs or [],
                          placement)


def format_grid(schedule: Schedule, include_comms: bool = False) -> str:
    """Each rank's program on one line, in execution order, columns aligned: 'rank 0 | 0F0 0F1 ...'."""
    rows = [[str(a) for a in actions if include_comms or a.is_compute] for actions in schedule]
    width = max((len(cell) for row in rows for cell in row), default=1)
    label = len(str(len(rows) - 1))
    return "\n".join(
        f"rank {r:>{label}} | " + " ".join(cell.ljust(width) for cell in row).rstrip() for r, row in enumerate(rows)
    )


def timeline_rows(result: SimResult) -> TimelineRows:
    """Compute actions of a simulation as draw_timeline rows: (start, end, type, stage, micro) per rank."""
    return [
        [(t.start, t.end, t.action.type.name, t.action.stage, t.action.micro) for t in rank if t.action.is_compute]
        for rank in result.timeline
    ]
