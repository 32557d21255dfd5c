"""Every command but the driver ends one way on Ctrl-C and one way on a closed pipe (runtime/entry.py): one line
and exit 130; nothing and exit 141. Each command's `python -m` entry is run with its work replaced by a
KeyboardInterrupt (what SIGINT raises in the main thread)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybrid_engine.runtime.entry import run_command
from launch_utils import REPO

RAISE = "lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())"


@pytest.mark.parametrize("module, patched, argv", [
    ("hybrid_engine.plan", "hybrid_engine.planner.grids.grid_table", ["--world-size", "2"]),
    ("hybrid_engine.schedule", "hybrid_engine.parallel.pipeline.schedule.simulate",
     ["--schedule", "1f1b", "--pp", "2", "--micro-batches", "4"]),
    ("hybrid_engine.sample", "hybrid_engine.train.sample.main", ["--load", "x", "--prompt", "a"]),
    ("hybrid_engine.hf", "hybrid_engine.hf.convert.import_model", ["import", "a", "b"]),
    ("hybrid_engine.data", "hybrid_engine.data.prepare.main", ["prepare", "a", "b"]),
])
def test_ctrl_c_on_every_command_is_one_line_and_exit_130(module, patched, argv):
    owner, name = patched.rsplit(".", 1)
    code = (f"import importlib, runpy, sys; m = importlib.import_module({owner!r}); setattr(m, {name!r}, {RAISE}); "
            f"sys.argv = [{module!r}, *{argv!r}]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 130, run.stderr
    assert run.stderr == f"python -m {module}: interrupted\n", run.stderr


def test_run_command_passes_main_s_code_on():
    assert run_command("p", lambda: 3) == 3
