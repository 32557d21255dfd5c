"""The fp8 profile's categories (experiments/analysis/profile_categories.py) from the archive of its device call
(experiments/results/raw/2026-11-27-4xH200-fp8-kernels-profiles.tgz): the same file as the one kept, every
category's device time within the run's busy time, and the LM head's GEMMs found among the GEMMs."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
SCRIPT = REPO / "experiments" / "analysis" / "profile_categories.py"
NAME = "2026-11-27-4xH200-fp8-kernels-profile"


def test_the_archive_gives_the_categories_kept(tmp_path):
    out = tmp_path / "categories.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(RESULTS / "raw" / f"{NAME}s.tgz"), str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = json.loads(out.read_text())
    assert made == json.loads((RESULTS / f"{NAME}-categories.json").read_text())
    assert set(made["runs"]) == {"l4_fp8-rank0", "l4_fp8_rowwise-rank0"}
    for run in made["runs"].values():
        device = run["device_ms"]
        assert sum(device.values()) >= run["gpu_busy_ms"] * 0.95  # kernels may overlap: at least the busy time
        assert device["head_gemm"] > device["gemm"] > 0 and device["fp8_cast"] > 0 and device["fp8_amax"] > 0
