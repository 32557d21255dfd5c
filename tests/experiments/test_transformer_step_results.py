"""The transformer-step pass's results file (experiments/analysis/transformer_step_results.py) from the logs of its
device call (experiments/results/raw/2026-11-27-4xH200-transformer-step-logs.tgz): the same file as the one kept,
the GPU tests cut by their limit said as such, and the graphed and fp8 runs each against the eager bf16 run."""
import json
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
SCRIPT = REPO / "experiments" / "analysis" / "transformer_step_results.py"


def test_the_logs_of_the_call_give_the_results_file_kept(tmp_path):
    with tarfile.open(RESULTS / "raw" / "2026-11-27-4xH200-transformer-step-logs.tgz") as archive:
        archive.extractall(tmp_path / "logs", filter="data")
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "logs"), str(out), "--card", "NVIDIA H200",
                           "--torch", "2.11.0+cu130"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = json.loads(out.read_text())
    assert made == json.loads((RESULTS / "2026-11-27-4xH200-transformer-step.json").read_text())
    assert made["gpu_tests"]["outcome"] == "timed out" and made["gpu_tests"]["tests_passed_before_the_limit"] == 1
    bench = made["head_bench"]
    assert bench["half_over_fused"] == round(bench["half_ms"] / bench["fused_ms"], 2)
    fp8 = made["ratios"]["l4_fp8"]
    assert fp8["vs"] == "l4_bf16" and fp8["target"] == 1.3 and fp8["met"] is False
    assert fp8["tokens_per_s_ratio"] == round(made["runs"]["l4_fp8"]["per_s"] / made["runs"]["l4_bf16"]["per_s"], 3)
    assert "l4_fp8" in made["ratios"] and "l4_bf16_graphs" in made["ratios"]
    assert "--cuda-graphs on" in made["runs"]["l4_bf16_graphs"]["cmd"]
