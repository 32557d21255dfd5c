"""`python -m hybrid_engine.plan`: for a world size and a model, a ranked table of grids (dp x pp x mp, beside every cp
size a token model's sequence splits into, unless --cp fixes one) under every ZeRO level the driver takes, each
one's best plan (schedule, micro-batches, memory), with why the others lose in numbers, and the winner as the
command that runs it; the planner lives in hybrid_engine/planner/. A GPU card (--plan-card h100|h200) is planned for
from any machine: its memory, and fp16 allowed. Takes the driver's flags that planning reads (the model, batch,
schedule, precision, memory cap and card); the grid's are the table's to choose, so they are refused::

    python -m hybrid_engine.plan --world-size 8 --model gpt --hidden 2048 --layers 16 --batch-size 16 --amp bf16 \\
        --plan-card h200 [--memory-cap-gib 80] [--calibrate]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Optional, Sequence

from hybrid_engine.config import flags
from hybrid_engine.config.plan import applies_to_planning
from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.runtime.entry import run_command

PROG = "python -m hybrid_engine.plan"


def build_parser() -> argparse.ArgumentParser:
    """The driver's flags that planning reads, and this command's own."""
    parser = flags.build_parser(registry.options(), PROG, keep=applies_to_planning)
    parser.description = ("A ranked table of every grid (dp x pp x mp, and cp for a model with sequences) and "
                          "ZeRO level of --world-size\nfor a model, each with its best plan, why the others lose, "
                          "and the first as the driver's command line.")
    parser.epilog = "exit codes: 0 the table; 2 bad input; 130 Ctrl-C."
    own = parser.add_argument_group(f"{PROG}'s own")
    own.add_argument("--world-size", type=int, default=1, metavar="N", help="ranks (GPUs) to plan for (default 1)")
    own.add_argument("--calibrate", action="store_true", default=False,
                     help="measure this device's GEMM and memory rates instead of its card's table entry")
    return parser


def refuse_driver_only_flags(argv: Sequence[str]) -> None:
    """A driver flag that planning does not read is one ConfigError naming it, never ignored."""
    driver = flags.build_parser(registry.options(), PROG)
    given, _ = driver.parse_known_args(list(argv))
    unread = [dest for dest in vars(given) if dest != "config" and not applies_to_planning(*dest.split("."))]
    if unread:
        names: dict[str, str] = {}
        for action in driver._actions:  # a field's own flag comes before its aliases
            if action.option_strings:
                names.setdefault(action.dest, action.option_strings[0])
        said = ", ".join(names[d] for d in unread)
        raise ConfigError(f"{said} {'does' if len(unread) == 1 else 'do'} not apply to planning: the table ranks "
                          "every dp x pp x mp of --world-size (the driver's --plan-only plans for its own flags)")


def unread_file_settings(cfg, given: dict) -> list[str]:
    """The settings (table.key) the --config file gives that planning does not read: a run's file holds its grid,
    steps and checkpoints too, so they are said, not refused."""
    if not given.get("config"):
        return []
    without = flags.config_of({k: v for k, v in given.items() if k != "config"}, registry.options())
    return [f"{table.name}.{f.name}" for table in dataclasses.fields(cfg)
            for f in dataclasses.fields(getattr(cfg, table.name)) if not applies_to_planning(table.name, f.name)
            and getattr(getattr(cfg, table.name), f.name) != getattr(getattr(without, table.name), f.name)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from hybrid_engine.planner.card import calibrate, this_device
    from hybrid_engine.planner.grids import grid_table
    from hybrid_engine.train.cli import device_type

    try:
        if any(a in ("-h", "--help") for a in argv):
            print(build_parser().format_help())
            return 0
        refuse_driver_only_flags(argv)
        given = vars(build_parser().parse_args(argv))
        world, calibrating = given.pop("world_size"), given.pop("calibrate")
        cfg = flags.config_of(given, registry.options())
        unread = unread_file_settings(cfg, given)
        if unread:
            print(f"note: --config {given['config']}: {', '.join(unread)} not read by planning (the table ranks "
                  "every grid of --world-size)", file=sys.stderr)
        kind = device_type(cfg.parallel.device)
        card = this_device(cfg.plan.card, kind)
        if calibrating:
            card = calibrate(card, kind)
        print(grid_table(cfg, world, kind, registry.check_model, card, user_flags=argv))
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_command(PROG, main))
