"""Section 9 of the report (report/llama.py): the Llama's GPU tables recompute every target from the two records it
compares, the real-text table and its checks come from the curves, and an absent or partial pass is stated, not
guessed."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from report.llama import load_llama, prose, runs_table, targets, targets_table, text_checks, text_table

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def test_the_committed_gpu_targets_are_recomputed_from_their_records():
    res = load_llama(RESULTS)
    assert [(f.phase, f.card) for f in res.files] == [("1gpu", "H200"), ("4gpu", "H200")]
    for f in res.files:
        runs = f.data["runs"]
        for r in targets(f):
            expected = runs[r["engine"]]["per_s"] / runs[r["peer"]]["per_s"]
            assert r["value"] == pytest.approx(expected)
            if r["target"] is not None:
                assert r["met"] == (expected >= r["target"]) == f.data["targets"][r["goal"]]["met"], r
        rows = {row[0]: row for row in runs_table(f, RESULTS).rows}
        assert set(rows) == set(runs)
        for name, row in rows.items():
            assert row[4] == f"{runs[name]['per_s']:,.0f}" and row[5] == f"{runs[name]['mfu']:.1%}"
    verdicts = {row[0]: row[-1] for f in res.files for row in targets_table(f).rows}
    assert verdicts[">= 1.1x plain PyTorch compiled"] == "missed"
    assert verdicts[">= 2x Megatron-core (local spec)"] == "met"
    assert verdicts["pp2 x tp2 >= 2x Megatron-core on the same grid"] == "missed"


def _text_file(gpt_vals, llama_vals, vocab=2048) -> dict:
    def run(name, vals):
        return {"model": name, "vocab": vocab, "params_m": 1.3, "model_line": f"model: {name}", "steps": 4,
                "train_loss": [7.6, 6.0, 5.0, 4.5], "val_loss": vals}
    return {"card": "CPU", "data": "d", "recipe": "r", "command": "x",
            "runs": {"gpt": run("GPT", gpt_vals), "llama": run("Llama", llama_vals)}}


def test_the_text_section_reads_its_curves_and_the_newest_file(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "2026-01-02-llama-vs-gpt-text.json").write_text(
        json.dumps(_text_file([[1, 6.0], [3, 5.0]], [[1, 6.2], [3, 4.8]])))
    (tmp_path / "cpu" / "2026-01-01-llama-vs-gpt-text.json").write_text(json.dumps(_text_file([[3, 9.0]], [[3, 9.0]])))
    res = load_llama(tmp_path)
    assert res.files == [] and res.text.path.name == "2026-01-02-llama-vs-gpt-text.json"
    assert [p.name for p, _ in res.ignored] == ["2026-01-01-llama-vs-gpt-text.json"]
    c = text_checks(res.text)
    assert (c["step"], c["llama"], c["gpt"]) == (3, 4.8, 5.0) and c["rel"] == pytest.approx(-0.04)
    assert c["learns"] and c["beside"]
    table = text_table(res.text, tmp_path)
    assert table.rows == [["1", "6.2000", "6.0000", "+0.2000"], ["3", "4.8000", "5.0000", "-0.2000"]]
    assert any("learns" in n and "met" in n for n in table.notes)
    blocks = prose(res, tmp_path)
    assert "not measured" in blocks[0][1] and "-4.00%" in blocks[1][1]


def test_a_pass_cut_short_shows_its_unrun_runs_and_absent_files_say_so(tmp_path):
    shutil.copy(RESULTS / "2026-11-27-1xH200-llama-1gpu.json", tmp_path / "2026-11-27-1xH200-llama-1gpu.json")
    data = json.loads((RESULTS / "2026-11-27-1xH200-llama-1gpu.json").read_text())
    data["runs"]["megatron_1gpu"] = {"error": "skipped: the pass's time budget ran out"}
    (tmp_path / "2026-11-28-1xH200-llama-1gpu.json").write_text(json.dumps(data))
    res = load_llama(tmp_path)
    assert [f.path.name for f in res.files] == ["2026-11-28-1xH200-llama-1gpu.json"]
    assert [p.name for p, _ in res.ignored] == ["2026-11-27-1xH200-llama-1gpu.json"]
    rows = {row[0]: row for row in runs_table(res.files[0], tmp_path).rows}
    assert set(rows["megatron_1gpu"][1:]) == {"not run"}
    by_goal = {r["goal"]: r for r in targets(res.files[0])}
    assert by_goal[">= 2x Megatron-core (local spec)"]["value"] is None
    assert not by_goal[">= 2x Megatron-core (local spec)"]["met"]  # no number is no verdict of met
    assert by_goal["beside plain PyTorch eager"]["met"] is None  # information only
    text = " ".join(b[1] for b in prose(res, tmp_path))
    assert "llama_text_cpu.sh" in text and re.search(r"compiled: 0\.98x \(missed\)", text)
    empty = " ".join(b[1] for b in prose(load_llama(tmp_path / "nothing"), tmp_path))
    assert "GPU runs are not measured" in empty and "real text is not measured" in empty
