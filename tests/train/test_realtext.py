"""The real-text device pass (experiments/passes/gpt_realtext_pass.sh) and its results file
(experiments/analysis/realtext_results.py): the results are computed right from metrics files, and the whole pass
runs end to end on the CPU at a tiny shape (SMOKE=1), so the one-GPU call works the first time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import realtext_results  # noqa: E402


def write_metrics(path: Path, losses: list[float], vals: dict[int, float], tokens_s: list[float]) -> str:
    """A driver metrics file: one record per step, a validation record after the steps it follows."""
    with open(path, "w") as f:
        for step, (loss, tps) in enumerate(zip(losses, tokens_s)):
            f.write(json.dumps({"step": step, "loss": loss, "step_time_s": 1.0 / tps, "tokens_per_s": tps,
                                "mfu": 0.25, "peak_mem_gib": [1.5]}) + "\n")
            if step in vals:
                f.write(json.dumps({"step": step, "val_loss": vals[step], "entropy_floor": None}) + "\n")
    return str(path)


def test_results_take_the_final_and_largest_relative_difference_and_the_median_after_warmup(tmp_path):
    bf16 = write_metrics(tmp_path / "b.jsonl", [5.0, 4.0, 3.0, 2.5, 2.0, 1.9], {2: 3.03, 5: 2.018},
                         [1.0, 900.0, 1000.0, 1100.0, 1200.0, 1300.0])
    fp32 = write_metrics(tmp_path / "f.jsonl", [5.0, 4.0, 3.0, 2.5, 2.0, 1.9], {2: 3.0, 5: 2.0},
                         [1.0, 400.0, 500.0, 600.0, 700.0, 800.0])
    out = tmp_path / "r.json"
    assert realtext_results.main(["--bf16", bf16, "--fp32", fp32, "--warmup", "2", "--card", "c", "--data", "d",
                                  "--shape", "s", "--command", "x", "--wall", "11 22", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    target, runs = result["target"], result["runs"]
    assert target["final_step"] == 5 and target["final_rel_diff"] == pytest.approx(0.009)
    assert target["max_rel_diff"] == pytest.approx(0.01) and target["met"]  # the largest was earlier, at step 2
    assert runs["bf16"]["val_loss"] == [[2, 3.03], [5, 2.018]] and runs["fp32"]["final_val_loss"] == 2.0
    assert runs["bf16"]["tokens_s"] == 1150.0 and runs["fp32"]["tokens_s"] == 650.0  # steps 2..5
    assert runs["bf16"]["train_loss"][0] == 5.0 and len(runs["fp32"]["train_loss"]) == 6
    assert (runs["bf16"]["wall_s"], runs["fp32"]["wall_s"]) == (11.0, 22.0)
    # 3% apart at the end: not met, and said so.
    worse = write_metrics(tmp_path / "w.jsonl", [5.0] * 6, {2: 3.0, 5: 2.06}, [1.0] * 6)
    assert realtext_results.main(["--bf16", worse, "--fp32", fp32, "--card", "c", "--data", "d", "--shape", "s",
                                  "--command", "x", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["target"]["final_rel_diff"] == pytest.approx(0.03)
    assert not json.loads(out.read_text())["target"]["met"]


def test_results_refuse_a_run_without_validation_in_one_line(tmp_path, capsys):
    fp32 = write_metrics(tmp_path / "f.jsonl", [5.0, 4.0], {1: 3.0}, [1.0, 2.0])
    none = write_metrics(tmp_path / "n.jsonl", [5.0, 4.0], {}, [1.0, 2.0])
    assert realtext_results.main(["--bf16", none, "--fp32", fp32, "--card", "c", "--data", "d", "--shape", "s",
                                  "--command", "x", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0 validation records" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("fp32_residual", ["0", "1"])
def test_the_pass_runs_end_to_end_on_the_cpu_at_a_tiny_shape(tmp_path, fp32_residual):
    """SMOKE=1 on the repository's README (bytes, as on the device, which has no tokenizers): both runs train,
    the results file holds both curves and the target, and experiments/results/ is left alone. FP32_RESIDUAL=1:
    the bf16 run keeps its residual stream in fp32 and the file says so in its name and command."""
    before = sorted(os.listdir(REPO / "experiments" / "results"))
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "TEXT": str(REPO / "README.md"), "TOKENIZE": "bytes", "OUT": str(out),
           "FP32_RESIDUAL": fp32_residual}
    done = subprocess.run(["bash", str(REPO / "experiments" / "passes" / "gpt_realtext_pass.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    suffix = "-fp32-residual" if fp32_residual == "1" else ""
    files = [f for f in os.listdir(out) if f.endswith(f"-1xcpu-gpt-realtext{suffix}.json")]
    assert len(files) == 1 and (out / "gpt_realtext.tgz").exists()
    result = json.loads((out / files[0]).read_text())
    assert "tokens: bytes" in result["data"] and "README.md" in result["data"]
    assert f"FP32_RESIDUAL={fp32_residual}" in result["command"]
    for prec in ("bf16", "fp32"):
        run = result["runs"][prec]
        assert run["steps"] == 6 and [s for s, _ in run["val_loss"]] == [2, 5] and run["tokens_s"] > 0
    assert result["target"]["final_step"] == 5 and result["target"]["final_rel_diff"] < 0.05
    assert "relative difference" in done.stdout
    assert sorted(os.listdir(REPO / "experiments" / "results")) == before
