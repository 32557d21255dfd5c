#!/usr/bin/env python3
"""Build the technical report PDF from experiments/results/ (no GPU, no network, no LaTeX).

    python report/build.py [--results experiments/results] [--out report/report.pdf]

Page order: title, 1 grid mapping, 2 pipeline overlap, then per card: 3 performance, 4 memory, 5 targets,
6 bottlenecks; 7 the GPT; 8 every 4-GPU grid; 9 the Llama; appendix: files used and the exact command of every
run. See report/README.md.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import matplotlib.pyplot as plt  # noqa: E402

from report import figures, gpt, grids, llama, tables, text  # noqa: E402
from report.data import NOT_MEASURED, Bench, Results, grid_of, grid_text, load, mode_text, ok, status  # noqa: E402
from report.gpt_data import GptResults, load_gpt  # noqa: E402
from report.grids import GridResults, load_grids  # noqa: E402
from report.llama import LlamaResults, load_llama  # noqa: E402
from report.render import Report  # noqa: E402

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb1")


def title_page(rep: Report, res: Results) -> None:
    blocks = [("p", "DP x PP x MP hybrid-parallel training engine (C++ core, Python driver): grid mapping, pipeline "
                    "overlap, performance against the Practical 10 base code and torch.distributed.pipelining, "
                    "memory, bottlenecks. Every number below is read from the results files listed in the appendix.")]
    for b in res.benches:
        m = b.meta
        blocks += [("h", f"Measurements: {m.get('gpus', '?')} x {m.get('card_full', b.card)}, {b.date}"),
                   ("b", f"torch {m.get('torch', '?')}, CUDA {m.get('cuda', '?')}, {m.get('gpu_memory_gib', '?')} GiB "
                         f"per GPU; bench wall time {m.get('elapsed_s', '?')} s; {sum(map(ok, b.runs))} of "
                         f"{len(b.runs)} planned runs produced numbers"),
                   ("b", f"results: {tables.rel(b.path, res.root)}"),
                   *(("b", f"{name}: {value:.2f} (goal {b.details.get(name, {}).get('target', '?')}, "
                           f"{ {True: 'met', False: 'missed'}.get(b.details.get(name, {}).get('met'), 'n/a') })")
                     for name, value in b.ratios.items() if "_vs_" in name and value is not None),
                   ("m", "python experiments/bench/bench.py " + " ".join(m.get("argv", []))
                    + "   # as run (meta.argv)")]
    if not res.benches:
        blocks.append(("p", f"No bench results file in {res.root}: performance sections are {NOT_MEASURED}."))
    blocks += [("h", "Rebuild this report (CPU only)"), ("m", "python report/build.py --results experiments/results "
                                                             "--out report/report.pdf"),
               ("h", "Contents"),
               ("b", "1 Grid mapping   2 Pipeline overlap   3 Performance   4 Memory   5 Targets   6 Bottlenecks   "
                     "7 GPT   8 4-GPU grids   9 Llama   Appendix: files used, every run's command")]
    rep.text("hybrid_engine: technical report", blocks)


def grid_pages(rep: Report, res: Results) -> None:
    fig = plt.figure(figsize=figures.PAGE)
    ax = fig.add_axes((0.03, 0.28, 0.94, 0.62))
    grid = figures.draw_grid(ax, 2, 2, 2)
    fig.suptitle("1. 3-D grid mapping: torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2",
                 fontsize=13, weight="bold")
    lines = [f"order {grid.order} (leftmost fastest): rank = mp + {grid.mp_size} * (dp + {grid.dp_size} * pp); "
             "on one node rank r drives cuda:r (LOCAL_RANK).",
             *(f"{axis.upper()} groups: {grid.groups(axis)}" for axis in ("mp", "dp", "pp")),
             f"model-parallel groups (PP x MP of one replica, where the loss scaler agrees): {grid.model_parallel_groups()}",
             "Each PP neighbour pair also gets 2 channels per direction (activations, gradients): own 2-rank groups."]
    for i, line in enumerate(lines):
        fig.text(0.05, 0.2 - i * 0.025, line, fontsize=8.5, family="monospace")
    figures.grid_legend(fig, 2)
    rep.add(fig, "1. Grid mapping dp2 x pp2 x mp2")
    for b in res.benches:
        ran: dict[tuple, dict[str, list[str]]] = {}  # grid -> mode -> "cfg prec" (not-run ones marked)
        for r in b.runs:
            if r.get("system") == "engine":
                ran.setdefault(grid_of(r), {}).setdefault(mode_text(r), []).append(
                    f"{r.get('config')} {r.get('prec')}" + ("" if ok(r) else f" {status(r)}"))
        done = [g for g, runs in ran.items() if any(ok(r) and grid_of(r) == g and r.get("system") == "engine"
                                                     for r in b.runs)]
        if not done:
            continue
        cols = min(2, len(done))
        rows_n = (len(done) + 1) // 2
        fig, axes = plt.subplots(rows_n, cols, figsize=figures.PAGE, squeeze=False)
        for ax, g in zip(axes.flat, done):
            figures.draw_grid(ax, *g, title=f"dp{g[0]} pp{g[1]} mp{g[2]}", small=True)
            runs = "; ".join(f"{m}: {', '.join(v)}" for m, v in ran[g].items())
            ax.text(0.5, 0.0, textwrap.fill("engine runs: " + runs, 110),
                    transform=ax.transAxes, ha="center", va="top", fontsize=7)
        for ax in list(axes.flat)[len(done):]:
            ax.axis("off")
        skipped = [f"{grid_text(dict(zip(('dp', 'pp', 'mp'), g)))}: " + "; ".join(f"{m} {', '.join(c)}"
                                                                         for m, c in v.items())
                   for g, v in ran.items() if g not in done]
        fig.suptitle(f"Grids the engine actually ran on 2 x {b.card} ({tables.rel(b.path, res.root)})", fontsize=12)
        fig.tight_layout(rect=(0, 0.08, 1, 0.95), h_pad=3.0)
        figures.grid_legend(fig, max(g[1] for g in done))
        if skipped:
            fig.text(0.05, 0.085, "planned, no numbers: " + "; ".join(skipped)[:200], fontsize=7.5)
        rep.add(fig, f"1. Grids run ({b.card})")


def overlap_pages(rep: Report, res: Results) -> None:
    fig2, bub2 = figures.schedules_figure(SCHEDULES, 2, 8)
    fig4, bub4 = figures.schedules_figure(SCHEDULES, 4, 8)
    rep.text("2. Pipeline overlap", text.overlap(res.benches[0] if res.benches else None, bub2, bub4))
    rep.figure(fig2, "2. Simulated schedules pp=2")
    rep.figure(fig4, "2. Simulated schedules pp=4")
    for b in res.benches:
        for i in range(0, len(b.traces), 2):
            rep.figure(figures.traces_figure(b, b.traces[i:i + 2]), f"2. Measured vs simulated ({b.card})")


def performance_pages(rep: Report, res: Results, b: Bench) -> None:
    fig, empty = figures.throughput_figure(b)
    if fig is not None:
        rep.figure(fig, f"3. Throughput ({b.card})",
                   f"No numbers at dp1 pp2 mp1 for: {'; '.join(empty)}." if empty else None)
    parts = [tables.pipeline_table(b, res.root), tables.bubble_table(b, res.root), tables.scaling_table(b, res.root),
             tables.tp_table(b, res.root)]
    for table in parts:
        table.title = "3. " + table.title
    rep.tables(parts)


def memory_pages(rep: Report, res: Results, b: Bench) -> None:
    parts = [tables.runs_table(b, res.root)]
    mb, conv = res.maxbatch.get(b.card), res.convergence.get(b.card)
    if mb and mb.results:
        parts.append(tables.maxbatch_table(mb, res.root))
    if conv:
        parts.append(tables.convergence_table(conv, res.root))
    missing = [[what, NOT_MEASURED] for what, have in (
        ("largest batch fp32 vs fp16 vs fp16 + recompute (experiments/bench/max_batch.py, *-maxbatch.jsonl)",
         mb and mb.results), ("fp16 vs fp32 loss curves (*-convergence.json)", conv)) if not have]
    if missing:
        parts.append(tables.Table(f"Memory and convergence measurements missing, {b.card}", ["measurement", "status"],
                                  missing, [f"no matching file for card {b.card} in {tables.rel(res.root, res.root)}"], [True] * len(missing)))
    for table in parts:
        table.title = "4. " + table.title
    rep.tables(parts)
    if conv:
        rep.figure(figures.convergence_figure(conv), f"4. Convergence ({b.card})")


def appendix(rep: Report, res: Results, g: GptResults, four: GridResults, lla: LlamaResults) -> None:
    rep.tables([tables.files_table(res)])
    blocks = []
    if g.used:
        blocks += [("h", "The GPT files (section 7): the command of each"), *gpt.commands(g, res.root), ("gap", "")]
    if four.files:
        blocks += [("h", "The 4-GPU grids (section 8): every run's command"), *grids.commands(four, res.root),
                   ("gap", "")]
    if lla.used:
        blocks += [("h", "The Llama (section 9): every run's command"), *llama.commands(lla, res.root), ("gap", "")]
    for b in res.benches:
        blocks += [("h", f"{tables.rel(b.path, res.root)}: the exact command of every run (cmd field)")]
        blocks += [("m", line) for line in tables.commands(b)]
        blocks.append(("gap", ""))
    for card, mb in res.maxbatch.items():
        blocks += [("h", f"{tables.rel(mb.path, res.root)}: every max-batch trial")]
        blocks += [("m", f"{t.get('mode')} batch {t.get('batch')} {t.get('status')}: {t.get('cmd')}") for t in mb.trials]
    rep.text("Appendix: commands", blocks)


def build(results: Path, out: Path) -> Report:
    res = load(results)
    g = load_gpt(results)  # the GPT's files replace report/data.py's "not a bench results file" verdict on them
    four = load_grids(results)  # and so do the 4-GPU grids' files
    lla = load_llama(results)  # and the Llama's
    res.files_used += g.used + four.used + lla.used
    res.files_ignored = ([(p, why) for p, why in res.files_ignored if p not in g.claimed | four.claimed | lla.claimed]
                         + g.ignored + four.ignored + lla.ignored)
    out.parent.mkdir(parents=True, exist_ok=True)
    rep = Report(str(out))
    title_page(rep, res)
    grid_pages(rep, res)
    overlap_pages(rep, res)
    for b in res.benches:
        performance_pages(rep, res, b)
        memory_pages(rep, res, b)
        t = tables.targets_table(b, res.maxbatch.get(b.card), res.root)
        t.title = "5. " + t.title
        rep.tables([t])
        rep.text(f"6. Bottlenecks ({b.card})", text.conclusions(b, res.maxbatch.get(b.card),
                                                                 res.convergence.get(b.card), res.root))
    gpt.gpt_pages(rep, g, res.root)
    grids.grid_pages(rep, four, res.root)
    llama.llama_pages(rep, lla, res.root)
    appendix(rep, res, g, four, lla)
    rep.close()
    return rep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "experiments" / "results")
    p.add_argument("--out", type=Path, default=REPO / "report" / "report.pdf")
    a = p.parse_args(argv)
    began = time.monotonic()
    rep = build(a.results, a.out)
    print(f"report: {rep.pages} pages -> {a.out} ({time.monotonic() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
