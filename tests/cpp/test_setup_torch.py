"""scripts/setup.sh installs the CPU build of torch where none is installed: on Linux, PyPI's torch==2.13.0 is the
CUDA build, so it asks for 2.13.0+cpu, first of pip's configured sources, then of the PyTorch CPU index. A stand-in
Python records the pip calls the script makes (no torch importable; the second pip call of a scenario fails where
the scenario says the configured sources lack the CPU build) and fails the install that follows, ending the script
before the build."""
import os
import platform
import stat
import subprocess

import pytest

from launch_utils import REPO

STUB = """#!/usr/bin/env bash
echo "$*" >> "{log}"
case "$*" in
  "-c import torch") exit 1 ;;
  *"+cpu --index-url"*) exit 0 ;;
  *"torch==2.13.0+cpu") exit {configured} ;;
  *) exit 3 ;;
esac
"""


def _pip_calls(tmp_path, configured_has_cpu_torch: bool) -> list[str]:
    log = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(STUB.format(log=log, configured=0 if configured_has_cpu_torch else 1))
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup.sh")], env={**os.environ, "PYTHON": str(stub)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr  # the tools' install, after torch's, is where the stand-in stops it
    return [line for line in log.read_text().splitlines() if "torch" in line and "pip" in line]


@pytest.mark.skipif(platform.system() != "Linux", reason="PyPI's torch is a CPU build off Linux")
def test_setup_installs_the_cpu_torch_from_the_configured_sources_when_they_hold_it(tmp_path):
    assert _pip_calls(tmp_path, True) == ["-m pip install -q torch==2.13.0+cpu"]


@pytest.mark.skipif(platform.system() != "Linux", reason="PyPI's torch is a CPU build off Linux")
def test_setup_installs_the_cpu_torch_from_the_pytorch_cpu_index_otherwise(tmp_path):
    assert _pip_calls(tmp_path, False) == [
        "-m pip install -q torch==2.13.0+cpu",
        "-m pip install -q torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"]
