"""The torch-free C++ core (grid + schedule) builds and passes its checks with a plain compiler.

No torch include path is given, so any torch header slipping into csrc/grid or csrc/schedule fails this test.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler (c++, g++ or clang++) on PATH")
def test_core_compiles_without_torch_and_passes_its_checks(tmp_path):
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "grid", "*.cpp")))
    sources += sorted(glob.glob(os.path.join(ROOT, "csrc", "schedule", "*.cpp")))
    sources.append(os.path.join(ROOT, "tests", "cpp", "test_core.cpp"))
    binary = tmp_path / "test_core"
    build = subprocess.run(
        [COMPILER, "-std=c++17", "-O1", "-Wall", "-I", os.path.join(ROOT, "csrc"), *sources, "-o", str(binary)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, f"core does not compile torch-free:\n{build.stderr[-4000:]}"
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all core checks passed" in run.stdout
