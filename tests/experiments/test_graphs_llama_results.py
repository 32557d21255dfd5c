"""The Llama graphs pass's results file (experiments/analysis/graphs_llama_results.py) on synthetic run logs: each
grid's graphs on against off, each 4-GPU run against 4 x one GPU with tp4's 0.8 target, every run's CUDA-graphs line,
and a failed run kept with its error and no ratio."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import graphs_llama_results  # noqa: E402


def _run(res: Path, name: str, tokens: float, loss: float, graphs: str, rc: int = 0) -> None:
    (res / f"{name}.cmd").write_text("python -m hybrid_engine.launch hybrid_engine.py --warmup 1 --model llama")
    (res / f"{name}.rc").write_text(str(rc))
    (res / f"{name}.log").write_text(f"stage 0: autograd, 18 modules\n{graphs}\nstep 0\n")
    lines = [{"step": i, "loss": loss, "step_time_s": 1.0 / t, "tokens_per_s": t, "tflops_per_gpu": t / 1000,
              "peak_mem_gib": [30.0]}
             for i, t in enumerate([1.0, tokens, tokens])]
    if rc == 0:
        (res / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_results_file_compares_on_with_off_and_four_gpus_with_one(tmp_path, capsys, monkeypatch):
    res = tmp_path / "res"
    res.mkdir()
    on = "CUDA graphs on (--cuda-graphs on: every stage's forward and backward replayed, one slot of graphs per ...)"
    _run(res, "gpu1_off", 100.0, 5.0, "CUDA graphs off (--cuda-graphs off)")
    _run(res, "gpu1_on", 110.0, 5.0, on)
    _run(res, "tp4_off", 300.0, 5.0, "CUDA graphs off (--cuda-graphs off)")
    _run(res, "tp4_on", 360.0, 5.005, on)
    _run(res, "pp4_off", 350.0, 5.0, "CUDA graphs off (--cuda-graphs off)")
    _run(res, "pp4_on", 1.0, 0.0, on, rc=1)
    (res / "graph_tests.cmd").write_text("python -m pytest tests/parallel/test_cuda_graphs_decoders_gpu.py")
    (res / "graph_tests.rc").write_text("0")
    (res / "graph_tests.log").write_text("...\n3 passed in 200.1s\n")
    out = tmp_path / "graphs-llama.json"
    monkeypatch.setattr(sys, "argv", ["graphs_llama_results.py", str(res), str(out), "--card", "NVIDIA H100",
                                      "--torch", "2.13", "--shape", "1B flags"])
    assert graphs_llama_results.main() == 0
    result = json.loads(out.read_text())
    r = result["ratios"]
    assert r["gpu1"] == {"on_vs_off": 1.1, "last_loss_rel_diff": 0.0}
    assert r["tp4"] == {"on_vs_off": 1.2, "last_loss_rel_diff": 0.001, "off_vs_4x_1gpu": 0.75,
                        "off_target_met": False, "on_vs_4x_1gpu": 0.818, "on_target_met": True}
    assert r["pp4"] == {"off_vs_4x_1gpu": 0.875} and "pp2tp2" not in r
    assert result["runs"]["pp4_on"]["error"].startswith("exit 1: ")
    assert result["runs"]["tp4_on"]["graphs_line"] == on and result["shape"] == "1B flags"
    assert result["graph_tests"] == "3 passed in 200.1s" and "graph_tests" not in result["runs"]
    assert "tp4: on_vs_off 1.2" in capsys.readouterr().out
