"""`python -m hybrid_engine.schedule`: print a pipeline schedule's per-rank action grid, its simulated bubble and
peak activations, and draw its timeline (the schedules themselves: parallel/pipeline/schedule.py)::

    python -m hybrid_engine.schedule --schedule 1f1b --pp 4 --micro-batches 8 [--virtual-stages 2] [--png runs/t.png]
"""
from __future__ import annotations

import argparse
import os
import sys
from fractions import Fraction
from typing import NoReturn, Optional, Sequence

import hybrid_engine._C as _C
from hybrid_engine.parallel.pipeline.schedule import (SCHEDULES, Costs, Schedule, SimResult, format_grid,
                                                      make_schedule, schedule_placement, simulate, timeline_rows)


def _fraction_text(x: float) -> str:
    """' (3/11)' when x is a simple fraction, else ''."""
    frac = Fraction(x).limit_denominator(10_000)
    return f" ({frac})" if frac.denominator > 1 and abs(float(frac) - x) < 1e-9 else ""


def _number(x: float) -> str:
    return f"{x:g}"


def _report(name: str, pp: int, micro_batches: int, virtual_stages: int, costs: Costs, rank_costs: Costs,
            schedule: Schedule, result: SimResult, include_comms: bool) -> str:
    lines = [
        f"schedule {name}: pp={pp}, micro-batches={micro_batches}, virtual stages={virtual_stages}, "
        f"{schedule_placement(name)} placement",
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
    parser.add_argument("--virtual-stages", type=int,
                        help="model chunks per rank (interleaved; zbv and dualpipev run 2; default: the schedule's "
                             "fewest)")
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
    v = args.virtual_stages if args.virtual_stages is not None else _C.schedule.least_virtual_stages(args.schedule)
    try:
        schedule = make_schedule(args.schedule, args.pp, args.micro_batches, v, args.lookahead)
        # Same model, same work per rank: a chunk holds 1/v of the rank's layers, so makespans compare across v.
        costs = Costs(F=rank_costs.F / v, B=rank_costs.B / v, I=rank_costs.I / v, W=rank_costs.W / v,
                      latency=args.latency)
        result = simulate(schedule, costs, placement=schedule_placement(args.schedule))
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
    from hybrid_engine.runtime.entry import run_command

    sys.exit(run_command("python -m hybrid_engine.schedule", main))
