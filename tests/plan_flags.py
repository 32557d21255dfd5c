"""The planner's Plan of a run's schedule flags (as Plan.flags() writes them, or a run's command line): the fields a
flag leaves out take Plan's defaults."""
from __future__ import annotations

from hybrid_engine.planner.candidates import Plan


def plan_of(flags: list[str]) -> Plan:
    value = {k: flags[flags.index(k) + 1] if k in flags else default
             for k, default in (("--schedule", None), ("--micro-batches", None), ("--virtual-stages", "1"),
                                ("--lookahead", "0"))}
    return Plan(value["--schedule"], int(value["--micro-batches"]), int(value["--virtual-stages"]),
                int(value["--lookahead"]), "--merge-wgrad" in flags)
