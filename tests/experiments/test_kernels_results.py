"""The kernels pass's results file (experiments/analysis/kernels_results.py) on synthetic run logs: the 1B shape's
fused kernels against unfused, the 8B shape's fp8 runs against bf16 with the 1.3x target, and a failed run kept
with its error and no ratio."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import kernels_results  # noqa: E402


def _run(res: Path, name: str, tokens: list[float], loss: float, peak: float, rc: int = 0) -> None:
    (res / f"{name}.cmd").write_text("python -m hybrid_engine.launch hybrid_engine.py --warmup 1 --model llama")
    (res / f"{name}.rc").write_text(str(rc))
    (res / f"{name}.log").write_text("step 0\nrank 0: out of memory\n")
    lines = [{"step": i, "loss": loss, "step_time_s": 1.0 / t, "tokens_per_s": t, "tflops_per_gpu": t / 1000,
              "peak_mem_gib": [peak]} for i, t in enumerate(tokens)]
    if rc == 0:
        (res / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_results_file_holds_every_run_and_the_ratios(tmp_path, capsys, monkeypatch):
    res = tmp_path / "res"
    res.mkdir()
    _run(res, "llama1b_fused_off", [1.0, 100.0, 100.0, 100.0], 5.0, 40.0)
    _run(res, "llama1b_fused_on", [1.0, 120.0, 120.0, 120.0], 5.0, 30.0)
    _run(res, "llama8b_bf16", [1.0, 50.0, 50.0], 7.0, 60.0)
    _run(res, "llama8b_fp8_tensorwise", [1.0, 70.0, 70.0], 7.07, 58.0)
    _run(res, "llama8b_fp8_rowwise", [], 0.0, 0.0, rc=1)
    out = tmp_path / "kernels.json"
    monkeypatch.setattr(sys, "argv", ["kernels_results.py", str(res), str(out), "--card", "NVIDIA H100", "--torch",
                                      "2.11", "--shape-1b", "1B flags", "--shape-8b", "8B flags"])
    assert kernels_results.main() == 0
    result = json.loads(out.read_text())
    r = result["ratios"]
    assert r["llama1b_fused_on"]["tokens_per_s_ratio"] == 1.2 and r["llama1b_fused_on"]["target"] is None
    assert r["llama1b_fused_on"]["peak_gib_ratio"] == 0.75
    assert r["llama8b_fp8_tensorwise"] == {"vs": "llama8b_bf16", "tokens_per_s_ratio": 1.4, "target": 1.3,
                                           "met": True, "peak_gib_ratio": 0.967, "last_loss_rel_diff": 0.01}
    assert "llama8b_fp8_rowwise" not in r
    assert result["runs"]["llama8b_fp8_rowwise"]["error"].startswith("exit 1: ")
    assert result["shape_8b"] == "8B flags" and result["card"] == "NVIDIA H100"
    assert "1.4x tokens/s (target 1.3x: met)" in capsys.readouterr().out
