"""experiments/analysis/plan_results.py on synthetic logs: auto against the best hand-tuned run, predicted against
measured."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "analysis"))
import plan_results  # noqa: E402


def metrics(path: Path, step_s: float, predicted_s: float, peak: float, predicted_peak: float, plan: str) -> None:
    steps = [json.dumps({"step": i, "loss": 0.5, "step_time_s": step_s}) for i in range(3)]
    summary = {"step": 2, "loss": 0.5, "summary": {"step_time_s": step_s, "predicted_step_time_s": predicted_s,
                                                   "peak_mem_gib": peak, "predicted_peak_mem_gib": predicted_peak,
                                                   "plan": plan}}
    path.write_text("\n".join(steps[:-1] + [json.dumps(summary)]) + "\n")


def test_auto_over_the_best_hand_tuned_run_and_the_prediction_errors(tmp_path):
    metrics(tmp_path / "L_auto.jsonl", 0.011, 0.010, 15.0, 14.0, "--schedule zb1 --micro-batches 4")
    (tmp_path / "L_auto.log").write_text("plan: zb1 + merged W, 4 micro-batches: predicted 10 ms/step\n")
    metrics(tmp_path / "L_1f1b_m4.jsonl", 0.022, 0.020, 14.0, 14.0, "--schedule 1f1b --micro-batches 4")
    metrics(tmp_path / "L_zb1merged_m4.jsonl", 0.010, 0.010, 15.0, 14.0, "--schedule zb1 --micro-batches 4")
    (tmp_path / "C_auto.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n")  # died before its summary
    out = tmp_path / "r.json"
    assert plan_results.main([str(tmp_path), str(out), "--card", "NVIDIA H200"]) == 0
    result = json.loads(out.read_text())
    assert result["auto_vs_best"]["L"] == {"auto_over_best": 1.1, "best": "L_zb1merged_m4",
                                           "auto_plan": "--schedule zb1 --micro-batches 4", "best_step_s": 0.010,
                                           "auto_step_s": 0.011}
    assert result["runs"]["L_auto"]["step_error"] == 0.1 and result["runs"]["L_1f1b_m4"]["peak_error"] == 0.0
    assert result["runs"]["L_auto"]["plan_line"].startswith("plan: zb1")
    assert "error" in result["runs"]["C_auto"] and "C" not in result["auto_vs_best"]
