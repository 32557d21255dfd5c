"""Section 8 of the report (report/grids.py): the 4-GPU grids' tables recompute every ratio from the records of the
committed results files, and an absent or partial pass is stated, not guessed."""
from __future__ import annotations

import json
import re
from pathlib import Path

from report.grids import load_grids, prose, runs_table, targets, targets_table

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def _times(cell: str) -> float:
    return float(re.match(r"([0-9.]+)x", cell)[1])


def test_every_ratio_is_recomputed_from_the_two_records_it_compares():
    g = load_grids(RESULTS)
    assert {f.phase for f in g.files} == {"mlp", "gpt"}
    for f in g.files:
        runs = f.data["runs"]
        table = runs_table(f, RESULTS)
        for row in table.rows:
            name, cell = row[0], row[6]
            base = (f.data["ratios"].get(name) or {}).get("baseline")
            if base is None or "per_s" not in runs[name]:
                continue
            assert abs(_times(cell) - runs[name]["per_s"] / runs[base]["per_s"]) < 0.006, (name, cell)
        for r in targets(f):
            assert r["met"] == (r["value"] is not None and r["value"] >= r["target"]), r
            assert r["met"] == f.data["targets"][r["goal"]]["met"], r


def test_a_pass_cut_short_shows_its_unrun_runs_and_an_absent_one_says_so(tmp_path):
    runs = {"L_1gpu_m1": {"gpus": 1, "step_ms": 10.0, "per_s": 100.0, "mfu": 0.4},
            "L_mp2": {"gpus": 2, "step_ms": 5.0, "per_s": 180.0, "mfu": 0.36},
            "L_base": {"error": "skipped: the pass's time budget ran out"}}
    data = {"card": "4 x NVIDIA H100", "unit": "samples/s", "runs": runs,
            "ratios": {"L_mp2": {"vs_1gpu": 1.8, "baseline": "L_1gpu_m1"}},
            "targets": {"L mp2 >= 1.6x one GPU": {"value": 1.8, "target": 1.6, "met": True}}}
    (tmp_path / "2026-01-01-4xH100-grids-mlp.json").write_text(json.dumps(data))
    (tmp_path / "2025-12-01-4xH100-grids-mlp.json").write_text(json.dumps(data))
    g = load_grids(tmp_path)
    assert [f.path.name for f in g.files] == ["2026-01-01-4xH100-grids-mlp.json"]
    assert [p.name for p, _ in g.ignored] == ["2025-12-01-4xH100-grids-mlp.json"]
    rows = {row[0]: row for row in runs_table(g.files[0], tmp_path).rows}
    assert rows["L_mp2"][6] == "1.80x (L_1gpu_m1)"
    assert set(rows["L_base"][2:]) == {"not run"}
    assert targets_table(g.files[0]).rows == [["L mp2 >= 1.6x one GPU", "1.800", "1.6", "met"]]
    assert "not measured" in prose(load_grids(tmp_path / "nothing"), tmp_path)[0][1]
