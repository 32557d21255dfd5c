"""The report (report/build.py) builds from the committed results on CPU, and its tables hold the numbers of the
results file: each checked cell is recomputed here straight from the JSON."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
sys.path.insert(0, str(REPO))

from report import build, tables  # noqa: E402
from report.data import NOT_MEASURED, is_bench, load  # noqa: E402

# The newest bench file, by the report's own rule (the GPT's files have "runs" too, but no "meta").
BENCH = sorted(p for p in RESULTS.glob("*.json") if is_bench(json.loads(p.read_text())))[-1]


def pdf_pages(path: Path) -> int:
    return len(re.findall(rb"/Type\s*/Page\b", path.read_bytes()))


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(BENCH.read_text())


@pytest.fixture(scope="module")
def bench():
    return next(b for b in load(RESULTS).benches if b.path == BENCH)


def run_where(raw: dict, **fields) -> tuple[int, dict]:
    return next((i, r) for i, r in enumerate(raw["runs"])
                if all(r.get(k, "") == v for k, v in {"variant": "", **fields}.items()))


def row_of(table: tables.Table, index: int) -> dict:
    row = next(r for r in table.rows if r[0] == str(index))
    return dict(zip(table.columns, row))


@pytest.mark.slow  # the whole PDF: about 30 s in this process
def test_report_builds_from_committed_results_with_expected_pages(tmp_path):
    out = tmp_path / "report.pdf"
    rep = build.build(RESULTS, out)
    assert out.exists() and out.stat().st_size > 50_000
    assert pdf_pages(out) == rep.pages
    assert 15 <= rep.pages <= 45
    assert rep.titles[0] == "hybrid_engine: technical report"
    assert any(t.startswith("1. Grid mapping") for t in rep.titles)
    assert any(t.startswith("2. Measured vs simulated") for t in rep.titles)
    assert any(t.startswith("6. Bottlenecks") for t in rep.titles)
    assert "7. GPT" in rep.titles  # the GPT section, after the per-card sections
    # Reproducible: the same results build to the same bytes (no build date in the PDF), so rebuilding the report
    # never dirties the checkout unless its content changed.
    again = tmp_path / "again.pdf"
    build.build(RESULTS, again)
    assert again.read_bytes() == out.read_bytes()


def test_pipeline_table_cells_equal_the_results_file(raw, bench):
    table = tables.pipeline_table(bench, RESULTS)
    i, eng = run_where(raw, system="engine", mode="zb1", config="L", prec="fp16", dp=1, pp=2, mp=1)
    _, base = run_where(raw, system="base", mode="practical10", config="L", prec="fp16", dp=1, pp=2, mp=1)
    _, peer = run_where(raw, system="peer", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    row = row_of(table, i)
    assert row["samples/s"] == f"{eng['samples_s']:,.0f}"
    assert row["step ms"] == f"{eng['step_ms']:.2f}"
    assert row["x base"] == f"{eng['samples_s'] / base['samples_s']:.2f}x"
    assert row["x peer 1F1B"] == f"{eng['samples_s'] / peer['samples_s']:.2f}x"
    assert row["MFU"] == f"{eng['mfu']:.1%}"


def test_every_skipped_run_renders_as_not_run_never_as_a_number(raw, bench):
    skipped = {i for i, r in enumerate(raw["runs"]) if "skipped" in r}
    assert skipped
    for table in (tables.pipeline_table(bench, RESULTS), tables.bubble_table(bench, RESULTS),
                  tables.runs_table(bench, RESULTS)):
        for row in table.rows:
            if int(row[0]) in skipped:
                numeric = row[table.columns.index("samples/s" if "samples/s" in table.columns else "simulated"):]
                assert all(cell == "not run" for cell in numeric), row


def test_failed_and_skipped_runs_in_a_synthetic_file(tmp_path, raw):
    data = json.loads(json.dumps(raw))
    i, _ = run_where(data, system="engine", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    j, _ = run_where(data, system="peer", mode="1f1b", config="L", prec="fp16", dp=1, pp=2, mp=1)
    keep = {k: data["runs"][i][k] for k in ("system", "mode", "config", "prec", "dp", "pp", "mp", "variant", "gpus")}
    data["runs"][i] = {**keep, "error": "exit 1: CUDA error: out of memory", "stderr_tail": "..."}
    data["runs"][j] = {**{k: data["runs"][j][k] for k in keep}, "skipped": "time budget spent"}
    (tmp_path / BENCH.name).write_text(json.dumps(data))
    b = load(tmp_path).benches[0]
    table = tables.pipeline_table(b, tmp_path)
    assert set(row_of(table, i).values()) >= {"failed"} and "not run" in row_of(table, j).values()
    assert row_of(table, i)["samples/s"] == "failed" and row_of(table, j)["samples/s"] == "not run"
    zb1, _ = run_where(data, system="engine", mode="zb1", config="L", prec="fp16", dp=1, pp=2, mp=1)
    assert row_of(table, zb1)["x peer 1F1B"] == "ref not run"


def test_targets_table_shows_the_files_ratios(raw, bench):
    table = tables.targets_table(bench, None, RESULTS)
    values = dict((r[0], r[1]) for r in table.rows)
    for name, value in raw["ratios"].items():
        assert values[name] == (f"{value:.3f}" if value is not None else "not run")


def test_maxbatch_and_convergence_are_read_when_present_and_named_missing_otherwise(tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    shutil.copy(BENCH, root / BENCH.name)
    older = json.loads(BENCH.read_text())
    (root / "2020-01-01-2xH200.json").write_text(json.dumps(older))  # older file of the same card: ignored
    res = load(root)
    assert [b.path.name for b in res.benches] == [BENCH.name]
    assert any(p.name == "2020-01-01-2xH200.json" for p, _ in res.files_ignored)
    assert not res.maxbatch and not res.convergence

    card = res.benches[0].card
    shape = {"dim": 8192, "depth": 16, "pp": 2, "schedule": "1f1b", "micro_batches": 8, "card": "NVIDIA " + card}
    lines = [{"kind": "trial", "mode": "fp32", "batch": 1024, "status": "ok", "peak_gib": 20.0, "cmd": "torchrun x"},
             {"kind": "result", "mode": "fp32", "max_batch": 20000, "first_failure": 21000, "converged": True,
              "reason": "bracket within 5%", "trials": 6, "peak_gib_at_max": 130.0, **shape},
             {"kind": "result", "mode": "fp16", "max_batch": 50000, "first_failure": 52000, "converged": True,
              "reason": "bracket within 5%", "trials": 5, "peak_gib_at_max": 131.0, **shape},
             {"kind": "ratios", "fp16_over_fp32": {"value": 2.5, "target": ">= 2", "met": True},
              "fp16-recompute_over_fp32": {"value": None, "target": ">= 8", "met": None}}]
    text = "\n".join(json.dumps(x) for x in lines) + "\n{\"kind\": \"tri"  # a line cut by a killed run
    (root / f"2026-11-27-2x{card}-maxbatch.jsonl").write_text(text)
    (root / f"2026-11-27-2x{card}-convergence.json").write_text(
        json.dumps({"fp32": [1.0, 0.5, 0.25], "fp16": [[0, 1.0], [1, 0.5], [2, 0.26]], "steps": 3}))
    res = load(root)
    mb = res.maxbatch[card]
    table = tables.maxbatch_table(mb, root)
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    assert rows["fp16"]["max batch"] == "50,000" and rows["fp16"]["x fp32"] == "2.50x" and rows["fp16"]["met"] == "yes"
    assert res.convergence[card].curves == {"fp32": [1.0, 0.5, 0.25], "fp16": [1.0, 0.5, 0.26]}
    conv = tables.convergence_table(res.convergence[card], root)
    assert dict(zip(conv.columns, conv.rows[1]))["last vs fp32"] == "+4.00%"

    from report.text import conclusions
    with_files = " ".join(t for _, t in conclusions(res.benches[0], mb, res.convergence[card], root))
    assert "fp16: 2.50x the fp32 max batch" in with_files and "Convergence: fp16 ends at 0.26" in with_files
    assert "Largest batch" not in with_files
    assert "from a trace: " + NOT_MEASURED in with_files  # this copy has no traces folder
    without = " ".join(t for _, t in conclusions(res.benches[0], None, None, root))
    assert f"Largest batch with AMP vs fp32 (and with recomputation): {NOT_MEASURED}" in without


def test_a_maxbatch_file_with_two_search_shapes_reports_both(tmp_path):
    """final_pass.sh appends a GPipe search after the 1F1B one: each keeps its own results and ratios."""
    from report.data import _read_maxbatch

    def search(schedule, micro, fp32, fp16):
        shape = {"dim": 4096, "depth": 16, "pp": 2, "schedule": schedule, "micro_batches": micro}
        cmd = f"torchrun x --schedule {schedule}"
        return [{"kind": "trial", "mode": "fp32", "batch": 1024, "status": "ok", "micro_batches": micro, "cmd": cmd},
                {"kind": "result", "mode": "fp32", "max_batch": fp32, "converged": True, **shape},
                {"kind": "result", "mode": "fp16", "max_batch": fp16, "converged": True, **shape},
                {"kind": "ratios", "fp16_over_fp32": {"value": fp16 / fp32, "target": ">= 2", "met": fp16 >= 2 * fp32},
                 **shape}]
    path = tmp_path / "2026-11-27-2xH200-maxbatch.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in search("1f1b", 8, 100, 190) + search("gpipe", 16, 40, 90)))
    mb = _read_maxbatch(path)
    assert mb.shape == "1f1b, m=8" and [o.shape for o in mb.others] == ["gpipe, m=16"]
    assert mb.results["fp16"]["max_batch"] == 190 and mb.others[0].results["fp16"]["max_batch"] == 90
    assert len(mb.trials) == 1 and len(mb.others[0].trials) == 1
    rows = {r[0]: r for r in tables.maxbatch_table(mb, tmp_path).rows}
    assert rows["fp16 (1f1b, m=8)"][5] == "1.90x" and rows["fp16 (gpipe, m=16)"][5] == "2.25x"
    assert rows["fp16 (gpipe, m=16)"][7] == "yes" and rows["fp16 (1f1b, m=8)"][7] == "NO"
