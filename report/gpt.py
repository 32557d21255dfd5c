"""Section 7, the GPT (issue #17): the GPT-1B shape on one GPU against its peers, per card; its data-parallel
scaling; pp=2 and tp=2 on two GPUs beside their peers (report/gpt_pptp.py); the validation-loss curves of the
real-text runs, bf16 (half weights, and by autocast) against fp32. Every cell is computed from one record of the
files report/gpt_data.py reads; a run whose file is absent is a sentence saying it has not been made."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from . import gpt_pptp  # noqa: E402
from .data import NOT_RUN, finite  # noqa: E402
from .figures import PAGE  # noqa: E402
from .gpt_data import GptFile, GptResults  # noqa: E402
from .render import Block, Report  # noqa: E402
from .tables import DASH, Table, gib, ms, pct, rate, rel, times  # noqa: E402

# The records of a -gpt.json in table order (experiments/passes/gpt_bench.sh names them); others follow in file order.
ENGINE = {"gpt_bf16_1f1b": "engine, bf16 half weights, 1f1b",
          "gpt_bf16_zb1m": "engine, bf16 half weights, zb1 + merged W",
          "gpt_fp16_zb1m": "engine, fp16 half weights (loss scaling), zb1 + merged W"}
PEERS = {"torch-compile": "torch.compile (bf16 autocast)", "torch": "plain PyTorch eager (bf16 autocast)",
         "megatron": "Megatron-core, local spec (bf16)"}
REFERENCE = "gpt_bf16_1f1b"  # the engine run every other row is compared with
REALTEXT_RUN = "bash experiments/passes/gpt_realtext_pass.sh"
AUTOCAST_RUN = "AMP_IMPL=autocast bash experiments/passes/gpt_realtext_pass.sh"
TARGET = 0.01
# How each real-text file's bf16 run held its weights (-gpt-realtext.json: the default; -autocast: --amp-impl autocast).
BF16_HOW = {"realtext": "bf16 half weights (the default)",
            "realtext_autocast": "bf16 by autocast (fp32 weights cast per matrix product)"}


def _tokens(rec: Optional[dict]) -> Optional[float]:
    return rec.get("tokens_s") if isinstance(rec, dict) and finite(rec.get("tokens_s")) else None


def _peak(rec: dict) -> Optional[float]:
    peak = rec.get("peak_gib")
    return max(peak) if isinstance(peak, list) and peak else peak


def bench_table(f: GptFile, root: Path) -> Table:
    """One GPU: every engine run and peer of the file; 'engine / it' is the engine's bf16 1f1b tokens/s over the
    row's (the same job, so the same card and torch)."""
    cols = ["system", "step ms", "tokens/s", "TFLOP/s/GPU", "MFU", "peak GiB", "engine / it"]
    t = Table(f"7. GPT-1B shape on one GPU, {f.card}", cols, [])
    ref = _tokens(f.data.get("engine", {}).get(REFERENCE))
    for group, labels in (("engine", ENGINE), ("peers", PEERS)):
        records = f.data.get(group, {})
        for key in [*labels, *(k for k in records if k not in labels)]:
            rec = records.get(key)
            if _tokens(rec) is None:
                t.rows.append([labels.get(key, key)] + [NOT_RUN] * (len(cols) - 1))
                t.shade.append(True)
                continue
            t.rows.append([labels.get(key, key), ms(rec.get("step_ms")), rate(rec["tokens_s"]),
                           f"{rec['tflops_per_gpu']:.1f}" if finite(rec.get("tflops_per_gpu")) else DASH,
                           pct(rec.get("mfu")), gib(_peak(rec)), times(ref / rec["tokens_s"]) if ref else DASH])
            t.shade.append(False)
    engine = f.data.get("engine", {})
    fp16, bf16 = _tokens(engine.get("gpt_fp16_zb1m")), _tokens(engine.get("gpt_bf16_zb1m"))
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', f.card)}; {f.data.get('command', '?')})",
               f"shape: {f.data.get('shape', '?')}",
               "engine / it: the engine's bf16 1f1b tokens/s over the row's. fp16 over bf16 (zb1 + merged W): "
               + (times(fp16 / bf16) if fp16 and bf16 else NOT_RUN) + "."]
    return t


def _dp_kind(name: str, gpus: int) -> str:
    """experiments/passes/gpt_dp_pass.sh's names: gpt_single, gpt_dp<N> (strong: the 1-GPU batch), gpt_dp<N>w (weak)."""
    if gpus == 1:
        return "1 GPU"
    return "weak" if re.match(r"gpt_dp\d+w", name) else "strong"


def dp_table(f: GptFile, root: Path) -> Table:
    """Every run of a -gpt-dp.json; efficiency = tokens/s over (GPUs x the 1-GPU run's tokens/s)."""
    cols = ["run", "GPUs", "scaling", "ZeRO-1", "step ms", "tokens/s", "MFU", "peak GiB per rank", "efficiency"]
    t = Table(f"7. GPT-1B shape, data parallel, {f.gpus} x {f.card}", cols, [])
    runs = f.data["runs"]
    single = _tokens(runs.get("gpt_single"))
    for name, rec in runs.items():
        if _tokens(rec) is None:
            t.rows.append([name] + [NOT_RUN] * (len(cols) - 1))
            t.shade.append(True)
            continue
        peaks = rec.get("peak_gib") if isinstance(rec.get("peak_gib"), list) else [rec.get("peak_gib")]
        gpus = len(peaks)
        eff = rec["tokens_s"] / (gpus * single) if single and gpus > 1 else None
        t.rows.append([name, str(gpus), _dp_kind(name, gpus), "yes" if name.endswith("_zero") else "no",
                       ms(rec.get("step_ms")), rate(rec["tokens_s"]), pct(rec.get("mfu")),
                       ", ".join(gib(p) for p in peaks), pct(eff) if eff is not None else DASH])
        t.shade.append(False)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', f.card)}; {f.data.get('command', '?')})",
               f"shape: {f.data.get('shape', '?')}",
               "efficiency: tokens/s over GPUs x gpt_single's tokens/s (strong: the same global batch; weak: the "
               "same batch per GPU)."]
    return t


def realtext_table(f: GptFile, root: Path, autocast: bool = False) -> Table:
    cols = ["precision", "steps", "first val loss", "final val loss", "vs fp32", "tokens/s", "step ms", "MFU",
            "peak GiB", "wall s"]
    how = ", bf16 by autocast (fp32 weights)" if autocast else ""
    t = Table(f"7. GPT on real text, bf16 against fp32{how}, {f.card}", cols, [])
    runs = f.data["runs"]
    ref = (runs.get("fp32") or {}).get("final_val_loss")
    for prec, run in runs.items():
        curve = run.get("val_loss") or []
        final = run.get("final_val_loss")
        diff = f"{(final - ref) / ref:+.3%}" if finite(final) and finite(ref) and prec != "fp32" else DASH
        t.rows.append([prec, str(run.get("steps", "?")), f"{curve[0][1]:.4f}" if curve else DASH,
                       f"{final:.4f}" if finite(final) else DASH, diff, rate(run.get("tokens_s")),
                       ms(run.get("step_ms")), pct(run.get("mfu")), gib(run.get("peak_gib")),
                       f"{run['wall_s']:.0f}" if finite(run.get("wall_s")) else DASH])
        t.shade.append(False)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', f.card)}; {f.data.get('command', '?')})",
               f"data: {f.data.get('data', '?')}", f"run: {f.data.get('shape', '?')}", _target_text(f) + "."]
    return t


def _target_text(f: GptFile) -> str:
    target = f.data.get("target", {})
    rel_diff = target.get("final_rel_diff")
    if not finite(rel_diff):
        return "target (bf16 and fp32 validation losses within 1%): no final difference in the file"
    verdict = "met" if rel_diff <= TARGET else "NOT met"
    return (f"target, bf16 and fp32 validation losses within 1% after step {target.get('final_step', '?')}: "
            f"{rel_diff:.3%} apart ({verdict}); largest over the curve {target.get('max_rel_diff', float('nan')):.3%}")


def comparisons(files: dict[str, Optional[GptFile]]) -> list[dict]:
    """Per real-text file of one card ({"realtext": f, "realtext_autocast": f}): its bf16 run's final validation
    loss against its own fp32 run's, recomputed from the two finals, and the 1% verdict."""
    out = []
    for kind, f in files.items():
        runs = f.data["runs"] if f else {}
        bf16, fp32 = (runs.get("bf16") or {}).get("final_val_loss"), (runs.get("fp32") or {}).get("final_val_loss")
        if f and finite(bf16) and finite(fp32):
            diff = abs(bf16 - fp32) / fp32
            out.append({"kind": kind, "how": BF16_HOW[kind], "bf16": bf16, "fp32": fp32, "diff": diff,
                        "met": diff <= TARGET})
    return out


def comparison_text(files: dict[str, Optional[GptFile]]) -> str:
    """One line stating both comparisons: "bf16 half weights (the default): final validation 4.0669 vs its fp32
    3.9062, 4.114% apart (1% target NOT met); bf16 by autocast ...: 3.9456 vs its fp32 3.9117, 0.865% apart (met)"."""
    return "; ".join(f"{c['how']}: final validation {c['bf16']:.4f} vs its fp32 {c['fp32']:.4f}, {c['diff']:.3%} "
                     f"apart (1% target {'met' if c['met'] else 'NOT met'})" for c in comparisons(files))


def _color(kind: str, prec: str, i: int) -> str:
    """One colour per run across both passes (each bf16 the same in both panels; the autocast pass's fp32 grey)."""
    known = {("realtext", "bf16"): "C0", ("realtext", "fp32"): "C1", ("realtext_autocast", "bf16"): "C2",
             ("realtext_autocast", "fp32"): "C7"}
    return known.get((kind, prec), f"C{3 + i}")


def realtext_figure(files: dict[str, Optional[GptFile]]) -> Figure:
    """Validation loss per evaluation, every run of one card's real-text files on one plot (top: the default pass
    solid, the autocast pass dashed); each bf16 run's relative difference from its own pass's fp32 run (bottom)."""
    fig, (ax, ax_d) = plt.subplots(2, 1, figsize=PAGE, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    present = {k: f for k, f in files.items() if f}
    plotted = False
    for kind, f in present.items():
        runs, auto = f.data["runs"], kind == "realtext_autocast"
        style = {"linestyle": "--" if auto else "-", "marker": "s" if auto else "o", "ms": 3}
        for i, (prec, run) in enumerate(runs.items()):
            steps, vals = zip(*run["val_loss"]) if run.get("val_loss") else ((), ())
            name = {"bf16": BF16_HOW[kind].split(" (")[0]}.get(prec, prec) + (" (autocast pass)" if auto and
                                                                                prec != "bf16" else "")
            ax.plot(steps, vals, lw=1.2, label=name, color=_color(kind, prec, i), **style)
        fp32 = dict(map(tuple, runs.get("fp32", {}).get("val_loss", [])))
        for prec, run in runs.items():
            pairs = [(s, (v - fp32[s]) / fp32[s]) for s, v in run.get("val_loss", []) if prec != "fp32" and s in fp32]
            if pairs:
                label = f"{BF16_HOW[kind].split(' (')[0] if prec == 'bf16' else prec} vs its fp32"
                ax_d.plot(*zip(*pairs), lw=1.0, label=label, color=_color(kind, prec, 0), **style)
                plotted = True
    card = next(iter(present.values())).card
    ax.set_ylabel("validation loss (nats per token)")
    ax.legend()
    ax.grid(linestyle=":", linewidth=0.5)
    names = ", ".join(f.path.name for f in present.values())
    ax.set_title(f"Validation loss on real text, {card} ({names})\n"
                 + textwrap.fill(comparison_text(files) + "; red dashed: the 1% target", 150), fontsize=9)
    ax_d.set_xlabel("step")
    ax_d.set_ylabel("(bf16 - fp32) / fp32, per pass")
    for y in (-TARGET, 0.0, TARGET):
        ax_d.axhline(y, color="black" if y == 0 else "#c0504d", lw=0.5, linestyle="-" if y == 0 else "--")
    ax_d.grid(linestyle=":", linewidth=0.5)
    if plotted:
        ax_d.legend()
    fig.tight_layout()
    return fig


def prose(g: GptResults, root: Path) -> list[Block]:
    """The section's summary, each number from a file; a missing run is said to be missing."""
    out: list[Block] = [("p", "The second workload, --model gpt: a decoder-only transformer split over the same "
                              "grid (heads, MLP and vocabulary over MP; stages cut to equal cost over PP; ZeRO-1 "
                              "over DP). Its correctness on every grid is held by tests (tests/models/test_gpt_engine.py); "
                              "this section holds its measurements.")]
    out.append(("h", "7.1 One GPU against the peers"))
    for f in g.benches:
        e = f.data.get("engine", {})
        ref, peers = _tokens(e.get(REFERENCE)), f.data.get("peers", {})
        if ref is None:
            out.append(("b", f"{f.card} ({rel(f.path, root)}): the engine's bf16 1f1b run {NOT_RUN}."))
            continue
        vs = ", ".join(f"{times(ref / _tokens(peers.get(k)))} {PEERS[k].split(' (')[0]}" for k in PEERS
                       if _tokens(peers.get(k)))
        out.append(("b", f"{f.card} ({rel(f.path, root)}): engine bf16 1f1b {rate(ref)} tokens/s "
                         f"({pct(e[REFERENCE].get('mfu'))} MFU): {vs or 'no peer measured'}."))
    if not g.benches:
        out.append(("b", "not measured in this results set (no *-gpt.json)."))
    out.append(("h", "7.2 Data-parallel scaling"))
    for f in g.dp:
        table = dp_table(f, root)
        cells = [f"{r[0]} {r[2]}{' ZeRO-1' if r[3] == 'yes' else ''} {r[8]}" for r in table.rows
                 if r[8] not in (DASH, NOT_RUN)]
        out.append(("b", f"{f.gpus} x {f.card} ({rel(f.path, root)}): efficiency " + "; ".join(cells) + "."))
    if not g.dp:
        out.append(("b", "not measured in this results set (no *-gpt-dp.json)."))
    out += gpt_pptp.prose(g.pp_tp, root)
    out.append(("h", "7.4 Real text: bf16 against fp32"))
    for kind in ("realtext", "realtext_autocast"):
        for f in getattr(g, kind):
            runs = f.data["runs"]
            finals = ", ".join(f"{p} {r.get('final_val_loss', float('nan')):.4f}" for p, r in runs.items())
            out.append(("b", f"{f.card}, {BF16_HOW[kind]} ({rel(f.path, root)}, {f.data.get('command', '?')}): "
                             f"final validation loss {finals}; {_target_text(f)}."))
    for card, files in realtext_cards(g).items():
        if all(files.values()):
            out.append(("b", f"{card}, both passes: {comparison_text(files)}."))
    if not g.realtext:
        out.append(("b", f"The real-text run has not been made: no *-gpt-realtext.json in {rel(root, root)}. It is "
                         f"one GPU call, `{REALTEXT_RUN}` (300 steps on .data/python-docs.txt, made by "
                         "experiments/bench/real_text.sh, in bf16 and in fp32 with one seed)."))
    if not g.realtext_autocast:
        out.append(("b", f"{BF16_HOW['realtext_autocast']}: not measured in this results set (no "
                         f"*-gpt-realtext-autocast.json); it is one GPU call, `{AUTOCAST_RUN}`."))
    return out


def realtext_cards(g: GptResults) -> dict[str, dict[str, Optional[GptFile]]]:
    """card -> {"realtext": its default-pass file or None, "realtext_autocast": its autocast-pass file or None}."""
    cards: dict[str, dict[str, Optional[GptFile]]] = {}
    for kind in ("realtext", "realtext_autocast"):
        for f in getattr(g, kind):
            cards.setdefault(f.card, {"realtext": None, "realtext_autocast": None})[kind] = f
    return cards


def gpt_pages(rep: Report, g: GptResults, root: Path) -> None:
    rep.text("7. GPT", prose(g, root))
    parts = [bench_table(f, root) for f in g.benches] + [dp_table(f, root) for f in g.dp]
    for f in g.pp_tp:
        parts += [gpt_pptp.runs_table(f, root), gpt_pptp.ratios_table(f, root)]
    parts += [realtext_table(f, root) for f in g.realtext]
    parts += [realtext_table(f, root, autocast=True) for f in g.realtext_autocast]
    if parts:
        rep.tables(parts)
    for card, files in realtext_cards(g).items():
        rep.figure(realtext_figure(files), f"7. GPT real text ({card})")


def commands(g: GptResults, root: Path) -> list[Block]:
    """The appendix lines: each GPT file's command."""
    files = g.benches + g.dp + g.pp_tp + g.realtext + g.realtext_autocast
    return [("m", f"{rel(f.path, root)}: {f.data.get('command', '?')}") for f in files]
