"""experiments/analysis/pp4_schedules_results.py: the pp4 schedules pass's logs (engine metrics, peer JSON lines, a
failure, a run skipped for time) into one results file, with the engine's best over torch pipelining's best and
every run's losses against the engine's 1f1b run. The pass itself runs end to end on the CPU with SMOKE=1."""
import json
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
sys.path.insert(0, str(EXPERIMENTS / "analysis"))

import pp4_schedules_results  # noqa: E402

CMD = "torchrun hybrid_engine.py --model gpt --batch-size 32 --seq-len 1024 --warmup 1 --pp 4"


def _engine(log_dir: Path, name: str, step_s: float, losses: list[float]) -> None:
    (log_dir / f"{name}.cmd").write_text(CMD + f" --schedule {name.split('_')[-1]}\n")
    (log_dir / f"{name}.rc").write_text("0\n")
    rows = [{"step": i, "loss": loss, "step_time_s": step_s, "tokens_per_s": 32768 / step_s, "tflops_per_gpu": 100.0,
             "mfu": 0.1, "peak_mem_gib": [20.0] * 4} for i, loss in enumerate(losses)]
    (log_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_results_file(tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out.json"
    logs.mkdir()
    _engine(logs, "engine_pp4_1f1b", 0.2, [10.0, 9.0, 8.0])
    _engine(logs, "engine_pp4_zbv", 0.1, [10.0, 9.0, 8.001])
    (logs / "torch_pp4_zbv_compile.cmd").write_text("torchrun gpt_pp_tp_peers.py --mode torch-pp-compile\n")
    (logs / "torch_pp4_zbv_compile.log").write_text(
        "noise\n" + json.dumps({"tokens_s": 131072, "step_ms": 250.0, "losses": [10.0, 9.0, 8.1]}) + "\n")
    (logs / "torch_pp4_1f1b.cmd").write_text("torchrun gpt_pp_tp_peers.py --mode torch-pp\n")
    (logs / "torch_pp4_1f1b.rc").write_text("1\n")
    (logs / "torch_pp4_1f1b.log").write_text("[rank0]: RuntimeError: no such schedule\n")
    (logs / "skipped.txt").write_text("engine_pp4_1f1b_compile\n")
    assert pp4_schedules_results.main([str(logs), str(out), "--card", "4 x cpu"]) == 0
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"engine_pp4_1f1b", "engine_pp4_zbv", "torch_pp4_zbv_compile", "torch_pp4_1f1b",
                                 "engine_pp4_1f1b_compile"}
    assert data["runs"]["engine_pp4_zbv"]["tokens_s"] == 327680 and data["runs"]["engine_pp4_zbv"]["step_ms"] == 100.0
    assert "RuntimeError: no such schedule" in data["runs"]["torch_pp4_1f1b"]["error"]
    assert data["runs"]["engine_pp4_1f1b_compile"]["error"].startswith("skipped")
    best = data["engine_best_vs_torch_best"]
    assert (best["value"], best["engine"], best["torch"], best["met"]) == (2.5, "engine_pp4_zbv",
                                                                         "torch_pp4_zbv_compile", True)
    checks = data["loss_check"]["runs"]
    assert checks["engine_pp4_zbv"]["within"] and not checks["torch_pp4_zbv_compile"]["within"]
