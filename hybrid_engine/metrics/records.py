"""The records of a `--metrics FILE` (one JSON object a line, written by rank 0: train/progress.py) and their kinds.
Every record leads with the key that names its kind, so that a reader tells them apart by the first key alone:

- `step`: a training step's own record (step, loss, step_time_s, samples_per_s, peak_mem_gib, ...). The timeline of
  the last step (`trace`) and the run's prediction beside its measurement (`summary`) join the last step's line as
  keys of it, so the file's last line is still the last step's.
- `val_loss`: a validation (`--eval-every N`): val_loss, entropy_floor, and the step after which it ran.
- `refit`: the planner's cost model refitted to the measured steps (`--learn-plan`): refit {...} and its step.
- `trace`, `summary`: on a line of their own only when no step of this run was written before them.

A resumed run appends to the file: its replayed steps appear twice, and the last of them wins. Every reader of these
files (the experiments' results scripts, the tests) asks this module, so that a validation or a refit is never taken
for a timed step.
"""
from __future__ import annotations

import json
from pathlib import Path

STEP, VALIDATION, REFIT, TRACE, SUMMARY = "step", "val_loss", "refit", "trace", "summary"
KINDS = (STEP, VALIDATION, REFIT, TRACE, SUMMARY)


def kind(record: dict) -> str:
    """The record's kind: its first key. A validation that leads with its step (as files written before the kinds
    led their records hold it) is still a validation: a step's record never carries a val_loss."""
    first = next(iter(record), None)
    if first == STEP and VALIDATION in record:
        return VALIDATION
    return first


def parse(text: str) -> list[dict]:
    """Every record of a metrics file's text, in order (blank lines and anything not a JSON object left out: a log
    with the driver's own lines around them reads alike)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def read(path: str | Path) -> list[dict]:
    """Every record of the metrics file at `path`, in order."""
    return parse(Path(path).read_text())


def steps(records: list[dict]) -> list[dict]:
    """The training steps' own records, in file order (a resumed run's replayed steps twice)."""
    return [r for r in records if kind(r) == STEP]


def last_steps(records: list[dict]) -> list[dict]:
    """One record per step, by step: where a resumed run replayed a step, its last record."""
    by_step = {r[STEP]: r for r in steps(records)}
    return [by_step[s] for s in sorted(by_step)]


def validation_losses(records: list[dict]) -> dict[int, float]:
    """{step: validation loss}, by step (a replayed validation: the last wins)."""
    return {r[STEP]: r[VALIDATION] for r in records if kind(r) == VALIDATION}
