"""What the experiment-program tests share: the toy shape every program runs at on CPU + gloo, the keys of the one
JSON record each prints (experiments/README.md), and running a program of experiments/peers/ as the benchmarks do."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
sys.path.insert(0, str(EXPERIMENTS / "bench"))

import launch  # noqa: E402
from engine_reference import first_loss  # noqa: E402

TINY = ["--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "4", "--steps", "3", "--warmup", "1",
        "--device", "cpu"]
RECORD_KEYS = {"system", "mode", "prec", "gpus", "dp", "pp", "mp", "dim", "depth", "batch", "micro", "step_ms",
               "samples_s", "tflops_per_gpu", "peak_gib", "losses"}


def tiny_first_loss() -> float:
    """Step 0's loss at TINY's shape, before any update: what every system must report first."""
    return first_loss(32, 4, 16)


def run_program(script: str, nproc: int, *args: str) -> dict:
    cmd = launch.torchrun(nproc, launch.free_port()) if nproc > 1 else [sys.executable]
    cmd += [str(EXPERIMENTS / "peers" / script), *args]
    done = subprocess.run(cmd, cwd=REPO, env=launch.child_env(cpu=True), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, launch.worker_stderr(done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, done.stdout  # one record, from rank 0 only
    return json.loads(lines[0])


def check_record(rec: dict, *, system: str, mode: str, prec: str, gpus: int, tol: float) -> None:
    assert RECORD_KEYS <= rec.keys()
    assert (rec["system"], rec["mode"], rec["prec"], rec["gpus"]) == (system, mode, prec, gpus)
    assert rec["timed_steps"] == 2 and rec["step_ms"] > 0 and len(rec["losses"]) == 3
    assert len(rec["peak_gib"]) >= 1 and all(math.isfinite(x) for x in rec["losses"])
    assert rec["losses"][0] == pytest.approx(tiny_first_loss(), rel=tol)
