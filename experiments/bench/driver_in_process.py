"""The driver (./hybrid_engine.py with this script's arguments) run inside a bench script's own process, so that the
script can wrap part of it first (e.g. Engine.train_step) and read what it left behind after: `enter()` before
importing hybrid_engine, `run()` to run the driver to its end, however it leaves.

The driver leaves through os._exit (no interpreter teardown); inside `run()` that exit is an exception, caught, so
the script carries on and writes its files."""
from __future__ import annotations

import os
import runpy
import sys

__all__ = ["enter", "run"]


class _Left(BaseException):
    """The driver's os._exit, caught."""


def _leave(code: int) -> None:
    raise _Left(code)


def enter() -> None:
    """The script's arguments become the driver's, the tree run from (not this folder) comes first on the import
    path, and os._exit raises instead of ending the process."""
    sys.argv = ["hybrid_engine.py"] + sys.argv[1:]
    sys.path.insert(0, os.getcwd())
    os._exit = _leave


def run() -> None:
    """The driver, to its end (its exit, or os._exit as `enter` made it)."""
    try:
        runpy.run_path("hybrid_engine.py", run_name="__main__")
    except (SystemExit, _Left):
        pass
