"""The Llama-against-GPT real-text results (experiments/analysis/llama_text_results.py) on synthetic logs: the two
checks are computed from the curves and the start-up lines, a mismatched pair is refused in one line, and the pass
script runs end to end on the CPU at a tiny setting, leaving experiments/results/ alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import llama_text_results  # noqa: E402

GPT_LINE = ("model: GPT, 4 layers, hidden 128, 4 heads, seq 128, vocab {v}, untied embeddings, 1.33M parameters; "
            "data x.tok; sequence parallel off; recompute none")
LLAMA_LINE = ("model: Llama, 4 layers, hidden 128, 4 heads (2 kv), head dim 32, ffn 384, seq 128, vocab {v}, untied "
              "embeddings, RoPE theta 10000, 1.31M parameters; data x.tok; sequence parallel off; recompute none")


def write_run(tmp: Path, name: str, line: str, losses: list[float], vals: dict[int, float]) -> list[str]:
    """A driver metrics file (one record per step, a validation record after the step it follows) and its log."""
    with open(tmp / f"{name}.jsonl", "w") as f:
        for step, loss in enumerate(losses):
            f.write(json.dumps({"step": step, "loss": loss, "step_time_s": 0.25, "tokens_per_s": 8192.0,
                                "mfu": None, "peak_mem_gib": []}) + "\n")
            if step in vals:
                f.write(json.dumps({"step": step, "val_loss": vals[step], "entropy_floor": None}) + "\n")
    (tmp / f"{name}.log").write_text(f"grid dp=1 x pp=1 x mp=1\n{line}\nstep 0  loss 7.6\n")
    return [f"--{name}", str(tmp / f"{name}.jsonl"), f"--{name}-log", str(tmp / f"{name}.log")]


def args(out: Path) -> list[str]:
    return ["--card", "c", "--data", "d", "--recipe", "r", "--command", "x", "--wall", "100 120", "--out", str(out)]


def test_the_checks_come_from_the_curves_and_the_start_up_lines(tmp_path, capsys):
    gpt = write_run(tmp_path, "gpt", GPT_LINE.format(v=2048), [7.6, 6.0, 5.0, 4.6], {1: 6.1, 3: 5.00})
    llama = write_run(tmp_path, "llama", LLAMA_LINE.format(v=2048), [7.6, 6.2, 5.1, 4.7], {1: 6.3, 3: 5.10})
    out = tmp_path / "r.json"
    assert llama_text_results.main(gpt + llama + args(out)) == 0
    result = json.loads(out.read_text())
    t, runs = result["target"], result["runs"]
    assert t["final_step"] == 3 and t["val_loss_llama_gpt"] == [[1, 6.3, 6.1], [3, 5.1, 5.0]]
    assert t["llama_rel_to_gpt"] == pytest.approx(0.02) and t["beside"]  # 2% above the GPT: within 5%
    assert t["uniform_loss"] == pytest.approx(7.624619) and t["learns"]  # ln 2048 - 5.1 = 2.52 nats >= 2
    assert runs["llama"]["params_m"] == 1.31 and runs["gpt"]["params_m"] == 1.33 and runs["gpt"]["vocab"] == 2048
    assert (runs["gpt"]["wall_s"], runs["llama"]["wall_s"]) == (100.0, 120.0)
    assert "beside the GPT: met" in capsys.readouterr().out
    # 10% above the GPT and only 1.6 nats below a uniform guess: neither check met, and the line says so.
    llama = write_run(tmp_path, "llama", LLAMA_LINE.format(v=2048), [7.6, 6.9, 6.3, 6.0], {1: 6.9, 3: 5.5})
    gpt = write_run(tmp_path, "gpt", GPT_LINE.format(v=2048), [7.6, 6.9, 6.3, 6.0], {1: 6.9, 3: 5.0})
    assert llama_text_results.main(gpt + llama + args(out)) == 0
    t = json.loads(out.read_text())["target"]
    assert t["llama_rel_to_gpt"] == pytest.approx(0.1) and not t["beside"] and t["learns"]
    llama = write_run(tmp_path, "llama", LLAMA_LINE.format(v=2048), [7.6, 6.9, 6.3, 6.0], {1: 6.9, 3: 5.7})
    gpt = write_run(tmp_path, "gpt", GPT_LINE.format(v=2048), [7.6, 6.9, 6.3, 6.0], {1: 6.9, 3: 6.0})
    assert llama_text_results.main(gpt + llama + args(out)) == 0
    t = json.loads(out.read_text())["target"]
    assert t["beside"] and not t["learns"]  # below the GPT, but 1.92 nats under ln V
    assert "learns: NOT met, beside the GPT: met" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.parametrize("change, message", [
    ("vocab", "the runs' vocabularies differ (2048 and 4096)"),
    ("steps", "the runs' step counts differ (4 and 3)"),
    ("line", "no 'model: ... vocab N, ... NM parameters' line"),
    ("vals", "0 validation records"),
])
def test_a_mismatched_or_incomplete_pair_is_one_line_and_no_file(tmp_path, capsys, change, message):
    gpt = write_run(tmp_path, "gpt", GPT_LINE.format(v=2048), [7.6, 6.0, 5.0, 4.6], {3: 5.0})
    line = "model: something else" if change == "line" else LLAMA_LINE.format(v=4096 if change == "vocab" else 2048)
    losses = [7.6, 6.2, 5.1] if change == "steps" else [7.6, 6.2, 5.1, 4.7]
    llama = write_run(tmp_path, "llama", line, losses, {} if change == "vals" else {2: 5.1})
    out = tmp_path / "r.json"
    assert llama_text_results.main(gpt + llama + args(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not out.exists()


def test_the_pass_runs_end_to_end_on_the_cpu_at_a_tiny_setting(tmp_path):
    """STEPS=6 on the README with a BPE of 300: both runs train and evaluate, the results file holds both curves at
    the same steps with their parameter counts, and experiments/results/ is left alone."""
    pytest.importorskip("tokenizers")
    before = sorted(os.listdir(REPO / "experiments" / "results" / "cpu"))
    env = {**os.environ, "STEPS": "6", "EVAL_EVERY": "3", "TEXT": str(REPO / "README.md"), "BPE": "300",
           "OUTDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO / "experiments" / "passes" / "llama_text_cpu.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (result_file,) = [f for f in os.listdir(tmp_path) if f.endswith("-llama-vs-gpt-text.json")]
    assert any(f.endswith("-llama-vs-gpt-text-logs.tgz") for f in os.listdir(tmp_path))
    result = json.loads((tmp_path / result_file).read_text())
    runs, t = result["runs"], result["target"]
    assert runs["llama"]["model"] == "Llama" and runs["gpt"]["model"] == "GPT"
    assert runs["llama"]["vocab"] == runs["gpt"]["vocab"] == 300
    assert [s for s, _, _ in t["val_loss_llama_gpt"]] == [2, 5]
    assert runs["llama"]["steps"] == runs["gpt"]["steps"] == 6
    assert abs(runs["llama"]["params_m"] - runs["gpt"]["params_m"]) / runs["gpt"]["params_m"] < 0.05
    assert "--lr-warmup" not in result["recipe"] and "warm-up 0" in result["recipe"]
    assert sorted(os.listdir(REPO / "experiments" / "results" / "cpu")) == before
