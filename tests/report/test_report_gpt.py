"""The report's GPT section (report/gpt.py, report/gpt_data.py): its tables hold the numbers of the committed GPT
results files, each cell recomputed here from the JSON; the real-text run is a line saying it has not been made
when its file is absent, and a table, a figure and the target's verdict when it is present; the pages build to the
same bytes twice. The pp=2 / tp=2 file (report/gpt_pptp.py) and the autocast real-text pass likewise: cells
recomputed from the JSON, a line saying each is not measured when its file is absent."""
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "experiments" / "analysis"))

import realtext_results  # noqa: E402
from report import gpt, gpt_pptp  # noqa: E402
from report.gpt_data import load_gpt  # noqa: E402
from report.render import Report  # noqa: E402

BENCHES = sorted(RESULTS.glob("*-1x*-gpt.json"))
DP = sorted(RESULTS.glob("*-gpt-dp.json"))
PP_TP = sorted(RESULTS.glob("*-gpt-pp-tp.json"))
REALTEXT = sorted(RESULTS.glob("*-gpt-realtext.json"))
AUTOCAST = sorted(RESULTS.glob("*-gpt-realtext-autocast.json"))


def rows_of(table) -> dict[str, dict]:
    return {r[0]: dict(zip(table.columns, r)) for r in table.rows}


def text_of(blocks) -> str:
    return " ".join(t for _, t in blocks)


def gpt_only(tmp_path: Path, extra: tuple = ()) -> Path:
    """A results folder holding only the committed GPT files of one GPU and of dp (no real-text or pp-tp file),
    and `extra`."""
    root = tmp_path / "results"
    root.mkdir()
    for path in BENCHES + DP + list(extra):
        shutil.copy(path, root / path.name)
    return root


def test_the_committed_gpt_files_are_read_and_older_ones_listed_as_ignored(tmp_path):
    assert BENCHES and DP
    g = load_gpt(RESULTS)
    assert [f.path for f in g.benches] == sorted(BENCHES, reverse=True)  # one per card, H200 first
    assert [f.path for f in g.dp] == DP and set(g.used) >= set(BENCHES + DP)
    assert not any("before" in p.name for p in g.claimed)  # kept for the record, not a GPT file of a kind here
    root = gpt_only(tmp_path)
    older = root / BENCHES[0].name.replace(BENCHES[0].name[:10], "2020-01-01")
    older.write_text(BENCHES[0].read_text())
    (root / "2026-11-26-1xH200-gpt-realtext.json").write_text("{\"runs\": [")
    g = load_gpt(root)
    assert older not in g.used and (older, "an older GPT file of the same kind and card") in g.ignored
    assert any(p.name.endswith("-gpt-realtext.json") and why.startswith("unreadable") for p, why in g.ignored)
    assert not g.realtext


@pytest.mark.parametrize("path", BENCHES, ids=[p.name for p in BENCHES])
def test_one_gpu_table_cells_equal_the_results_file(path):
    raw = json.loads(path.read_text())
    f = next(f for f in load_gpt(RESULTS).benches if f.path == path)
    rows = rows_of(gpt.bench_table(f, RESULTS))
    ref = raw["engine"]["gpt_bf16_1f1b"]
    engine = rows[gpt.ENGINE["gpt_bf16_1f1b"]]
    assert engine["tokens/s"] == f"{ref['tokens_s']:,.0f}" and engine["MFU"] == f"{ref['mfu']:.1%}"
    assert engine["step ms"] == f"{ref['step_ms']:.2f}" and engine["engine / it"] == "1.00x"
    for key, ratio in (("torch-compile", "engine_bf16_1f1b_over_torch_compile"),
                       ("torch", "engine_bf16_1f1b_over_torch_eager"), ("megatron", "engine_bf16_1f1b_over_megatron")):
        peer = raw["peers"][key]
        row = rows[gpt.PEERS[key]]
        assert row["tokens/s"] == f"{peer['tokens_s']:,.0f}" and row["MFU"] == f"{peer['mfu']:.1%}"
        assert row["engine / it"] == f"{ref['tokens_s'] / peer['tokens_s']:.2f}x"
        assert abs(float(row["engine / it"][:-1]) - raw["ratios"][ratio]) <= 0.006  # the file's own ratio
    fp16 = raw["engine"]["gpt_fp16_zb1m"]["tokens_s"] / raw["engine"]["gpt_bf16_zb1m"]["tokens_s"]
    assert f"fp16 over bf16 (zb1 + merged W): {fp16:.2f}x" in " ".join(gpt.bench_table(f, RESULTS).notes)


def test_dp_table_efficiency_is_the_files_scaling_efficiency():
    raw = json.loads(DP[-1].read_text())
    f = load_gpt(RESULTS).dp[0]
    rows = rows_of(gpt.dp_table(f, RESULTS))
    single = raw["runs"]["gpt_single"]["tokens_s"]
    assert rows["gpt_single"]["efficiency"] == "–" and rows["gpt_single"]["scaling"] == "1 GPU"
    for name, ratio in (("gpt_dp2", "strong_efficiency"), ("gpt_dp2_zero", "strong_efficiency_zero"),
                        ("gpt_dp2w", "weak_efficiency"), ("gpt_dp2w_zero", "weak_efficiency_zero")):
        row = rows[name]
        assert row["efficiency"] == f"{raw['runs'][name]['tokens_s'] / (2 * single):.1%}"
        assert abs(float(row["efficiency"][:-1]) / 100 - raw["ratios"][ratio]) <= 0.0011
        assert row["GPUs"] == "2" and row["ZeRO-1"] == ("yes" if "zero" in ratio else "no")
        assert row["scaling"] == ratio.split("_")[0]


class Pages(Report):
    """A Report that keeps page titles only (no PDF): for checking which pages the section makes."""

    def __init__(self):
        self.pages, self.titles, self._page_title = 0, [], ""

    def add(self, fig, title):
        import matplotlib.pyplot as plt

        self.pages += 1
        self.titles.append(title)
        plt.close(fig)


def test_without_the_real_text_file_the_section_says_the_run_has_not_been_made(tmp_path):
    root = gpt_only(tmp_path)
    g = load_gpt(root)
    prose = text_of(gpt.prose(g, root))
    assert "The real-text run has not been made: no *-gpt-realtext.json" in prose
    assert "bash experiments/passes/gpt_realtext_pass.sh" in prose
    assert "not measured in this results set (no *-gpt-realtext-autocast.json)" in prose
    assert "AMP_IMPL=autocast bash experiments/passes/gpt_realtext_pass.sh" in prose
    assert "not measured in this results set (no *-gpt-pp-tp.json)" in prose
    assert "bash experiments/passes/gpt_pp_tp_pass.sh" in prose
    pages = Pages()
    gpt.gpt_pages(pages, g, root)
    assert pages.titles[0] == "7. GPT" and not any("real text" in t or "pp=2" in t for t in pages.titles)


def realtext_file(root: Path, tmp_path: Path, bf16_final: float) -> Path:
    """A real-text results file as the pass writes it (experiments/analysis/realtext_results.py on two metrics
    files)."""
    def metrics(name: str, vals: dict[int, float], tps: float) -> str:
        path = tmp_path / f"{name}.jsonl"
        with open(path, "w") as out:
            for step in range(6):
                out.write(json.dumps({"step": step, "loss": 5.0 - step * 0.5, "step_time_s": 0.1, "tokens_per_s": tps,
                                      "mfu": 0.3, "peak_mem_gib": [6.0]}) + "\n")
                if step in vals:
                    out.write(json.dumps({"step": step, "val_loss": vals[step]}) + "\n")
        return str(path)

    out = root / "2026-11-26-1xH100-gpt-realtext.json"
    assert realtext_results.main(["--bf16", metrics("bf16", {2: 3.05, 5: bf16_final}, 4e5),
                                  "--fp32", metrics("fp32", {2: 3.0, 5: 2.0}, 1.6e5), "--card", "1 x H100",
                                  "--data", "python-docs.txt, bytes", "--shape", "GPT tiny", "--command",
                                  "bash experiments/passes/gpt_realtext_pass.sh", "--wall", "30 60", "--out", str(out)]) == 0
    return out


def test_with_the_real_text_file_the_section_has_its_table_figure_and_verdict(tmp_path):
    root = gpt_only(tmp_path)
    path = realtext_file(root, tmp_path, 2.01)
    raw = json.loads(path.read_text())
    g = load_gpt(root)
    assert [f.path for f in g.realtext] == [path] and path in g.used
    rows = rows_of(gpt.realtext_table(g.realtext[0], root))
    assert rows["bf16"]["final val loss"] == "2.0100" and rows["fp32"]["final val loss"] == "2.0000"
    assert rows["bf16"]["vs fp32"] == "+0.500%" and rows["fp32"]["vs fp32"] == "–"
    assert rows["bf16"]["first val loss"] == f"{raw['runs']['bf16']['val_loss'][0][1]:.4f}"
    assert rows["bf16"]["tokens/s"] == "400,000" and rows["fp32"]["wall s"] == "60"
    prose = text_of(gpt.prose(g, root))
    assert "final validation loss bf16 2.0100, fp32 2.0000" in prose and "0.500% apart (met)" in prose
    assert "has not been made" not in prose
    pages = Pages()
    gpt.gpt_pages(pages, g, root)
    assert pages.titles[-1] == "7. GPT real text (H100)"
    # 3% apart: the verdict says so.
    realtext_file(root, tmp_path, 2.06)
    assert "3.000% apart (NOT met)" in text_of(gpt.prose(load_gpt(root), root))


@pytest.mark.slow  # two PDFs with a figure: about 8 s
def test_the_gpt_pages_build_to_the_same_bytes_twice(tmp_path):
    root = gpt_only(tmp_path, (*PP_TP, *AUTOCAST))
    realtext_file(root, tmp_path, 2.01)
    g = load_gpt(root)
    assert g.pp_tp and g.realtext and g.realtext_autocast
    built = []
    for name in ("a.pdf", "b.pdf"):
        rep = Report(str(tmp_path / name))
        gpt.gpt_pages(rep, g, root)
        rep.close()
        built.append((tmp_path / name).read_bytes())
    assert built[0] == built[1] and len(built[0]) > 10_000


def test_the_new_kinds_are_told_apart_by_their_whole_name(tmp_path):
    assert PP_TP and REALTEXT and AUTOCAST
    g = load_gpt(RESULTS)
    assert [f.path for f in g.pp_tp] == PP_TP and [f.path for f in g.realtext] == REALTEXT
    assert [f.path for f in g.realtext_autocast] == AUTOCAST and set(g.used) >= set(PP_TP + REALTEXT + AUTOCAST)
    root = gpt_only(tmp_path, (AUTOCAST[0],))
    (root / "2026-11-26-1xH100-gpt-realtext-other.json").write_text(REALTEXT[0].read_text())  # no kind of ours
    (root / "2026-11-26-2xH100-gpt-pp.json").write_text(PP_TP[0].read_text())
    g = load_gpt(root)
    assert not g.realtext and not g.pp_tp and [f.path.name for f in g.realtext_autocast] == [AUTOCAST[0].name]
    assert not any(p.name.endswith(("-other.json", "-gpt-pp.json")) for p in g.claimed)


def test_pp_tp_table_cells_equal_the_results_file():
    raw = json.loads(PP_TP[-1].read_text())
    f = load_gpt(RESULTS).pp_tp[0]
    rows = rows_of(gpt_pptp.runs_table(f, RESULTS))
    assert set(rows) == set(raw["runs"])
    tol = raw["loss_tolerance"]["max_rel_diff"]
    for name, rec in raw["runs"].items():
        row = rows[name]
        assert row["tokens/s"] == f"{rec['tokens_s']:,.0f}" and row["MFU"] == f"{rec['mfu']:.1%}"
        assert row["step ms"] == f"{rec['step_ms']:.2f}"
        assert row["peak GiB per rank"] == ", ".join(f"{p:.1f}" for p in rec["peak_gib"])
        assert row["GPUs"] == str(rec.get("gpus", len(rec["peak_gib"])))
        check = raw["loss_check"].get(name)
        if check:
            assert row["loss vs 1 GPU"] == f"{check['max_rel_diff']:.1e} " + ("ok" if check["max_rel_diff"] <= tol
                                                                              else "OVER")
        else:
            assert row["loss vs 1 GPU"] == "–"
    assert rows["engine_pp2_1f1b"]["grid"] == "pp2 tp1" and rows["dtensor_tp_sp"]["grid"] == "pp1 tp2 SP"
    targets = rows_of(gpt_pptp.ratios_table(f, RESULTS))
    assert set(targets) == set(raw["ratios"])
    for key, r in raw["ratios"].items():
        value = raw["runs"][r["engine"]]["tokens_s"] / raw["runs"][r["peer"]]["tokens_s"]
        row = targets[key]
        assert row["engine / peer"] == f"{value:.2f}x" and abs(value - r["value"]) <= 0.0006
        assert row["goal"] == f">= {r['target']:.2f}x"
        assert row["verdict"] == ("met" if value >= r["target"] else "missed") == ("met" if r["met"] else "missed")
    prose = text_of(gpt_pptp.prose([f], RESULTS))
    worst = max(raw["loss_check"], key=lambda k: raw["loss_check"][k]["max_rel_diff"])
    assert f"{raw['loss_check'][worst]['max_rel_diff']:.1e} ({worst}), tolerance {tol}" in prose
    r = raw["ratios"]["pp_engine_vs_best_torch_pipelining"]
    assert f"pp_engine_vs_best_torch_pipelining {r['value']:.2f}x (goal {r['target']}x, " in prose


def test_pp_tp_tokens_per_second_is_computed_where_the_record_holds_none(tmp_path):
    raw = json.loads(PP_TP[-1].read_text())
    want = raw["runs"]["engine_1gpu"]["tokens_s"]
    raw["runs"]["engine_1gpu"]["tokens_s"] = None  # no batch or seq in an engine record: from `shape`
    raw["runs"]["torch_pp"]["tokens_s"] = None  # batch and seq in the record
    root = tmp_path / "results"
    root.mkdir()
    (root / PP_TP[-1].name).write_text(json.dumps(raw))
    f = load_gpt(root).pp_tp[0]
    rows = rows_of(gpt_pptp.runs_table(f, root))
    tps = 16 * 2048 / (raw["runs"]["engine_1gpu"]["step_ms"] / 1000)
    assert rows["engine_1gpu"]["tokens/s"] == f"{tps:,.0f}*" and abs(tps - want) <= 1
    torch_pp = raw["runs"]["torch_pp"]
    assert rows["torch_pp"]["tokens/s"] == f"{torch_pp['batch'] * torch_pp['seq'] / torch_pp['step_ms'] * 1000:,.0f}*"
    assert "engine_1gpu, torch_pp" in " ".join(gpt_pptp.runs_table(f, root).notes)


def test_the_autocast_pass_is_drawn_and_stated_beside_the_half_weights_one(tmp_path):
    g = load_gpt(RESULTS)
    files = gpt.realtext_cards(g)["H100"]
    assert files["realtext"].path == REALTEXT[-1] and files["realtext_autocast"].path == AUTOCAST[-1]
    line = gpt.comparison_text(files)
    for path, how in ((REALTEXT[-1], "bf16 half weights"), (AUTOCAST[-1], "bf16 by autocast")):
        runs = json.loads(path.read_text())["runs"]
        bf16, fp32 = runs["bf16"]["final_val_loss"], runs["fp32"]["final_val_loss"]
        diff = abs(bf16 - fp32) / fp32
        assert (f"{how}" in line and f"final validation {bf16:.4f} vs its fp32 {fp32:.4f}, {diff:.3%} apart "
                f"(1% target {'met' if diff <= 0.01 else 'NOT met'})" in line)
    assert "4.114% apart (1% target NOT met)" in line and "0.865% apart (1% target met)" in line
    assert f"both passes: {line}." in text_of(gpt.prose(g, RESULTS))
    rows = rows_of(gpt.realtext_table(g.realtext_autocast[0], RESULTS, autocast=True))
    auto = json.loads(AUTOCAST[-1].read_text())["runs"]
    assert rows["bf16"]["final val loss"] == f"{auto['bf16']['final_val_loss']:.4f}"
    fig = gpt.realtext_figure(files)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["bf16 half weights", "fp32", "bf16 by autocast", "fp32 (autocast pass)"]
    assert len(fig.axes[1].get_lines()) == 2 + 3  # the two bf16 differences and the target lines
    # The autocast pass alone: its table and its figure, and the half-weights run said to be missing.
    root = gpt_only(tmp_path, (AUTOCAST[-1],))
    g = load_gpt(root)
    pages = Pages()
    gpt.gpt_pages(pages, g, root)
    assert pages.titles[-1] == "7. GPT real text (H100)"
    prose = text_of(gpt.prose(g, root))
    assert "The real-text run has not been made" in prose and "both passes" not in prose
    assert "H100, bf16 by autocast (fp32 weights cast per matrix product) (" in prose and "0.865% apart (met)" in prose
