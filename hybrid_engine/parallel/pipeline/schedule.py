"""Pipeline schedules as data: the Python face of the C++ schedule core (csrc/schedule/).

A schedule is one list of :class:`Action` per pipeline rank, e.g. ``[[0F0, 0SEND_F0, ...], [1RECV_F0, 1F0, ...]]``.
Stage ``s`` (a global virtual-stage index, ``0 .. pp * v - 1``) runs on rank ``s % pp``. The executor runs a
rank's list literally; :func:`simulate` dry-runs all lists together with costs per action.

Command line (prints the per-rank action grid, the simulated bubble and peak activations, draws the timeline)::

    python -m hybrid_engine.schedule --schedule 1f1b --pp 4 --micro-batches 8 [--virtual-stages 2] [--png runs/t.png]
"""
from __future__ import annotations

import argparse
import os
import sys
from fractions import Fraction
from typing import NoReturn, Optional, Sequence

import hybrid_engine._C as _C

_core = _C.schedule

Action = _core.Action
ActionType = _core.ActionType
Costs = _core.Costs
SimResult = _core.SimResult
TimedAction = _core.TimedAction
ScheduleDeadlockError = _core.ScheduleDeadlockError

SCHEDULES: tuple[str, ...] = tuple(_core.schedule_names())

Schedule = list[list[Action]]
# One row per rank of (start, end, type, stage, micro): the input of hybrid_engine.metrics.timeline.draw_timeline.
TimelineRows = list[list[tuple[float, float, str, int, int]]]

__all__ = [
    "Action", "ActionType", "Costs", "SimResult", "TimedAction", "ScheduleDeadlockError", "SCHEDULES",
    "make_schedule", "compute_schedule", "add_communication", "validate", "simulate", "num_stages_of",
    "format_grid", "timeline_rows", "main",
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


def add_communication(schedule: Schedule, num_stages: Optional[int] = None) -> Schedule:
    """Insert sends right after their producer and receives one compute ahead of their consumer."""
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    return _core.add_communication(schedule, len(schedule), stages)


def validate(schedule: Schedule, micro_batches: Optional[int] = None, num_stages: Optional[int] = None) -> None:
    """Raise ValueError naming the rank and the action of the first structural problem (see validate.h)."""
    if micro_batches is None:
        micro_batches = 1 + max((a.micro for actions in schedule for a in actions), default=0)
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    _core.validate(schedule, len(schedule), stages, micro_batches)


def simulate(schedule: Schedule, costs: Optional[Costs] = None, num_stages: Optional[int] = None,
             stage_costs: Optional[list[Costs]] = None) -> SimResult:
    """Dry-run all ranks. Costs are per action (one stage, one micro-batch); default F=1, B=2, I=1, W=1.
    stage_costs: one Costs per stage, used for that stage's actions instead (latency stays costs').

    Raises ValueError for a malformed schedule and ScheduleDeadlockError (a RuntimeError) naming the stuck
    action of every rank when no rank can progress.
    """
    stages = num_stages if num_stages is not None else num_stages_of(schedule)
    return _core.simulate(schedule, len(schedule), stages, costs if costs is not None else Costs(), stage_costs or [])


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


def _fraction_text(x: float) -> str:
    """' (3/11)' when x is a simple fraction, else ''."""
    frac = Fraction(x).limit_denominator(10_000)
    return f" ({frac})" if frac.denominator > 1 and abs(float(frac) - x) < 1e-9 else ""


def _number(x: float) -> str:
    return f"{x:g}"


def _report(name: str, pp: int, micro_batches: int, virtual_stages: int, costs: Costs, rank_costs: Costs,
            schedule: Schedule, result: SimResult, include_comms: bool) -> str:
    lines = [
        f"schedule {name}: pp={pp}, micro-batches={micro_batches}, virtual stages={virtual_stages}",
        f"costs per rank F={_number(rank_costs.F)} B={_number(rank_costs.B)} I={_number(rank_costs.I)} "
        f"W={_number(rank_costs.W)}, latency {_number(costs.latency)}"
        + (f" (each of {virtual_stages} chunks costs 1/{virtual_stages})" if virtual_stages > 1 else ""),
        "",
        format_grid(schedule, include_comms),
        "",
        f"makespan {_number(result.makespan)}, bubble {result.bubble:.3f}{_fraction_text(result.bubble)}",
        "rank  busy  idle  peak activations",
    ]
    for r in range(pp):
        lines.append(f"{r:>4}  {_number(result.busy[r]):>4}  {_number(result.idle[r]):>4}  "
                     f"{result.peak_activations[r]:>16}")
    if virtual_stages > 1:
        lines.append(f"(activations counted per chunk; a chunk holds 1/{virtual_stages} of a rank's layers)")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit status 2, with no usage block or traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parse_costs(text: str) -> Costs:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--costs wants numbers F,B,I,W (got '{text}')") from None
    if len(values) != 4 or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--costs wants four non-negative numbers F,B,I,W (got '{text}')")
    return Costs(F=values[0], B=values[1], I=values[2], W=values[3])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(prog="python -m hybrid_engine.schedule",
                     description="Print and simulate a pipeline schedule; optionally draw its timeline.")
    parser.add_argument("--schedule", required=True, choices=SCHEDULES)
    parser.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    parser.add_argument("--micro-batches", type=int, required=True)
    parser.add_argument("--virtual-stages", type=int, default=1, help="model chunks per rank (interleaved)")
    parser.add_argument("--lookahead", type=int, default=0,
                        help="1f1b/zb1: extra warm-up forwards on every rank but the last (default 0)")
    parser.add_argument("--costs", type=_parse_costs, default=Costs(),
                        help="F,B,I,W time of one micro-batch through all of a rank's layers; with v chunks "
                             "each chunk costs 1/v of it (default 1,2,1,1)")
    parser.add_argument("--latency", type=float, default=0.0, help="time from a send to its arrival (default 0)")
    parser.add_argument("--comms", action="store_true", help="show sends and receives in the grid")
    parser.add_argument("--png", help="draw the simulated timeline to this file")
    args = parser.parse_args(argv)
    if args.latency < 0:
        parser.error(f"--latency must be >= 0 (got {args.latency:g})")

    rank_costs: Costs = args.costs
    v = args.virtual_stages
    try:
        schedule = make_schedule(args.schedule, args.pp, args.micro_batches, v, args.lookahead)
        # Same model, same work per rank: a chunk holds 1/v of the rank's layers, so makespans compare across v.
        costs = Costs(F=rank_costs.F / v, B=rank_costs.B / v, I=rank_costs.I / v, W=rank_costs.W / v,
                      latency=args.latency)
        result = simulate(schedule, costs)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    print(_report(args.schedule, args.pp, args.micro_batches, v, costs, rank_costs, schedule, result, args.comms))
    if args.png:
        from hybrid_engine.metrics.timeline import draw_timeline  # matplotlib only when a picture is wanted

        title = (f"{args.schedule}: pp={args.pp}, m={args.micro_batches}"
                 + (f", v={v}" if v > 1 else "") + f", bubble {result.bubble:.3f}")
        try:
            os.makedirs(os.path.dirname(args.png) or ".", exist_ok=True)  # e.g. runs/t.png in a fresh checkout
            draw_timeline(timeline_rows(result), args.png, title=title, time_label="time (cost units)")
        except OSError as exc:
            parser.error(f"cannot write {args.png}: {exc}")
        print(f"timeline written to {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
