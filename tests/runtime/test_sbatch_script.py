"""scripts/slurm/train.sbatch run by bash with fake `scontrol` and `srun` on PATH (the fake srun records its
arguments and the rendezvous variables it was given instead of launching): a long node list, the srun launch's
port, a malformed node list without scontrol."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

from launch_utils import REPO

SCRIPT = REPO / "scripts" / "slurm" / "train.sbatch"
FAKE_SRUN = """#!/bin/bash
echo "args: $*" >> "$SHIM_LOG"
echo "MASTER_ADDR=${MASTER_ADDR-unset} MASTER_PORT=${MASTER_PORT-unset}" >> "$SHIM_LOG"
"""
MANY_HOSTS = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 1
seq -f 'n%g' 0 199999  # more than a pipe holds: a reader that stops at the first line closes it early
"""


def _shims(tmp_path, scontrol: bool) -> str:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("srun", FAKE_SRUN), *((("scontrol", MANY_HOSTS),) if scontrol else ())):
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def _sbatch(tmp_path, nodelist: str, scontrol: bool = True, **env) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "srun.log"
    base = {"PATH": f"{_shims(tmp_path, scontrol)}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable,
            "SHIM_LOG": str(log), "SLURM_SUBMIT_DIR": str(REPO), "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "t",
            "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": "2", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(["bash", str(SCRIPT), "--steps", "1"], env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    return run, log.read_text() if log.exists() else ""


def test_a_long_node_list_gives_its_first_host(tmp_path):
    run, srun = _sbatch(tmp_path, "n[0-199999]")
    assert run.returncode == 0, run.stderr
    assert "--rdzv_endpoint=n0:29500" in srun and "(head n0)" in run.stdout


def test_an_srun_launch_leaves_the_port_to_the_job_unless_one_is_given(tmp_path):
    run, srun = _sbatch(tmp_path, "n[0-3]", LAUNCH="srun")
    assert run.returncode == 0, run.stderr
    assert "MASTER_ADDR=unset MASTER_PORT=unset" in srun  # the driver derives 20000 + job id mod 12768 itself


def test_an_explicit_master_port_is_kept_under_srun(tmp_path):
    run, srun = _sbatch(tmp_path, "n[0-3]", LAUNCH="srun", MASTER_PORT="31000")
    assert run.returncode == 0, run.stderr
    assert "MASTER_PORT=31000" in srun


def test_a_malformed_node_list_without_scontrol_is_one_line(tmp_path):
    run, srun = _sbatch(tmp_path, "gpu[01", scontrol=False)
    assert run.returncode == 2 and srun == ""
    assert run.stderr == "hybrid_engine: error: host list 'gpu[01': '[' without ']'\n", run.stderr
