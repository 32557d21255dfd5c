"""Section 9, the Llama: the Llama-1B-like shape on one GPU and on pp2 x tp2 beside plain PyTorch and Megatron-core
(experiments/passes/llama_pass.sh through experiments/analysis/llama_results.py, `<date>-<gpus>x<card>-llama-<1gpu|
4gpu>.json`, newest per phase and card), and a small Llama beside a GPT of the same parameter count on real text on
the CPU (experiments/passes/llama_text_cpu.sh through experiments/analysis/llama_text_results.py,
`cpu/<date>-llama-vs-gpt-text.json`, the newest). Every ratio is recomputed from the two records it compares and
judged against the file's goal; the text run's checks are recomputed from its curves."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt

from .data import NOT_RUN, finite
from .figures import PAGE
from .render import Block, Report
from .tables import DASH, Table, gib, ms, pct, rate, rel, times

NAME = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpus>\d+)x(?P<card>[^-]+)-llama-(?P<phase>1gpu|4gpu)\.json$")
TEXT = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-llama-vs-gpt-text\.json$")
RUN = {phase: f"PHASE={phase} bash experiments/passes/llama_pass.sh" for phase in ("1gpu", "4gpu")}
TEXT_RUN = "bash experiments/passes/llama_text_cpu.sh"
LEARNED_NATS, BESIDE = 2.0, 0.05  # experiments/analysis/llama_text_results.py's checks


@dataclass
class LlamaFile:
    path: Path
    card: str
    phase: str
    data: dict


@dataclass
class LlamaResults:
    files: list[LlamaFile] = field(default_factory=list)
    text: Optional[LlamaFile] = None
    used: list[Path] = field(default_factory=list)
    ignored: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def claimed(self) -> set[Path]:
        return set(self.used) | {p for p, _ in self.ignored}


def _read(path: Path, out: LlamaResults, needs: str) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        out.ignored.append((path, f"unreadable: {exc}"))
        return None
    if not isinstance(data, dict) or not isinstance(data.get(needs), dict):
        out.ignored.append((path, f"a Llama file without its '{needs}'"))
        return None
    return data


def load_llama(root: Path) -> LlamaResults:
    out = LlamaResults()
    found: dict[tuple[str, str], list[tuple[str, LlamaFile]]] = {}
    for path in sorted(Path(root).glob("*-llama-*.json")):
        m = NAME.match(path.name)
        data = _read(path, out, "runs") if m else None
        if data is not None:
            found.setdefault((m["card"], m["phase"]), []).append((m["date"], LlamaFile(path, m["card"], m["phase"],
                                                                                       data)))
    for key in sorted(found):
        files = sorted(found[key], key=lambda e: (e[0], e[1].path.name))
        out.files.append(files[-1][1])
        out.ignored += [(f.path, "an older Llama file of the same phase and card") for _, f in files[:-1]]
    out.files.sort(key=lambda f: (f.phase, f.card))
    texts = []
    for path in sorted((Path(root) / "cpu").glob("*-llama-vs-gpt-text.json")):
        m = TEXT.match(path.name)
        data = _read(path, out, "runs") if m else None
        if data is not None:
            texts.append((m["date"], LlamaFile(path, "CPU", "text", data)))
    if texts:
        texts.sort(key=lambda e: (e[0], e[1].path.name))
        out.text = texts[-1][1]
        out.ignored += [(f.path, "an older Llama-against-GPT text file") for _, f in texts[:-1]]
    out.used = [f.path for f in out.files] + ([out.text.path] if out.text else [])
    return out


def per_s(rec: Optional[dict]) -> Optional[float]:
    return float(rec["per_s"]) if isinstance(rec, dict) and finite(rec.get("per_s")) else None


def targets(f: LlamaFile) -> list[dict]:
    """Each target of the file: engine tokens/s over the peer's, recomputed from their records, against its goal
    (None: shown for information)."""
    out = []
    for goal, t in (f.data.get("targets") or {}).items():
        a, b = per_s(f.data["runs"].get(t.get("engine"))), per_s(f.data["runs"].get(t.get("peer")))
        value = a / b if a is not None and b else None
        target = t.get("target") if finite(t.get("target")) else None
        met = None if target is None else (value is not None and value >= target)
        out.append({"goal": goal, "engine": t.get("engine"), "peer": t.get("peer"), "value": value,
                    "target": target, "met": met})
    return out


def runs_table(f: LlamaFile, root: Path) -> Table:
    unit = f.data.get("unit", "per s")
    peak = f.data.get("peak_tflops")
    cols = ["run", "system", "GPUs", "step ms", unit, "MFU", "peak GiB (max rank)", "final loss"]
    t = Table(f"9. The Llama, {f.phase}, {f.data.get('card', f.card)}", cols, [])
    for name, rec in f.data["runs"].items():
        if per_s(rec) is None:
            t.rows.append([name] + [NOT_RUN] * (len(cols) - 1))
            t.shade.append(True)
            continue
        peaks = [p for p in rec.get("peak_gib") or [] if finite(p)]
        t.rows.append([name, rec.get("system", "engine"), str(rec.get("gpus", "?")), ms(rec.get("step_ms")),
                       rate(rec["per_s"]), pct(rec.get("mfu")), gib(max(peaks)) if peaks else DASH,
                       f"{rec['last_loss']:.4f}" if finite(rec.get("last_loss")) else DASH])
        t.shade.append(False)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', '?')}, torch {f.data.get('torch', '?')}; "
               f"`{RUN.get(f.phase, '?')}`); shape: {f.data.get('shape', '?')}",
               f"MFU: model FLOPs per GPU over the datasheet peak ({peak} TFLOP/s); Megatron-core starts from its own "
               "initial weights, so its losses compare with the others only in size."]
    return t


def targets_table(f: LlamaFile) -> Table:
    t = Table(f"9. The Llama's targets, {f.phase}, {f.data.get('card', f.card)}",
              ["target", "engine run / peer run", "value", "goal", "verdict"], [])
    for r in targets(f):
        verdict = "info" if r["met"] is None else ("met" if r["met"] else "missed")
        t.rows.append([r["goal"], f"{r['engine']} / {r['peer']}", times(r["value"]),
                       f"{r['target']}x" if r["target"] is not None else DASH, verdict])
        t.shade.append(r["met"] is False)
    return t


def text_checks(f: LlamaFile) -> dict:
    """The text run's two checks, recomputed from its curves: the final validation losses at the last step both
    runs evaluated, the Llama's against ln(vocabulary) and against the GPT's."""
    runs = f.data["runs"]
    gpt_at = dict((s, v) for s, v in runs["gpt"]["val_loss"])
    shared = [(s, v, gpt_at[s]) for s, v in runs["llama"]["val_loss"] if s in gpt_at]
    step, llama, gpt = shared[-1]
    uniform = math.log(runs["llama"]["vocab"])
    rel_ = (llama - gpt) / gpt
    return {"step": step, "llama": llama, "gpt": gpt, "uniform": uniform, "rel": rel_,
            "learns": uniform - llama >= LEARNED_NATS, "beside": rel_ <= BESIDE, "curve": shared}


def text_table(f: LlamaFile, root: Path) -> Table:
    runs, c = f.data["runs"], text_checks(f)
    t = Table("9. A small Llama and a GPT of the same size on real text (CPU): validation loss",
              ["step", "Llama", "GPT", "Llama - GPT"], [])
    for step, llama, gpt in c["curve"]:
        t.rows.append([str(step), f"{llama:.4f}", f"{gpt:.4f}", f"{llama - gpt:+.4f}"])
        t.shade.append(False)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', '?')}; `{TEXT_RUN}`)",
               f"data: {f.data.get('data', '?')}; both: {f.data.get('recipe', '?')}",
               f"Llama: {runs['llama'].get('model_line', '?')}", f"GPT: {runs['gpt'].get('model_line', '?')}",
               f"learns (final <= ln V - {LEARNED_NATS:g} = {c['uniform'] - LEARNED_NATS:.3f}): "
               f"{'met' if c['learns'] else 'missed'}; beside the GPT (within {BESIDE:.0%} or below): "
               f"{'met' if c['beside'] else 'missed'} ({c['rel']:+.2%})"]
    return t


def text_figure(f: LlamaFile):
    runs = f.data["runs"]
    fig, ax = plt.subplots(figsize=PAGE)
    fig.subplots_adjust(left=0.08, right=0.97, top=0.88, bottom=0.16)
    for name, style, color in (("llama", "-", "tab:orange"), ("gpt", "--", "tab:blue")):
        r = runs[name]
        ax.plot(range(len(r["train_loss"])), r["train_loss"], style, color=color, alpha=0.3,
                label=f"{name} train ({r.get('params_m', '?')}M parameters)")
        ax.plot([s for s, _ in r["val_loss"]], [v for _, v in r["val_loss"]], style, color=color, marker="o",
                label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle("9. The Llama and the GPT on real text, same parameter count, steps and recipe (CPU)", fontsize=12)
    return fig


def prose(res: LlamaResults, root: Path) -> list[Block]:
    out: list[Block] = []
    for f in res.files:
        judged = [r for r in targets(f) if r["met"] is not None]
        verdicts = "; ".join(f"{r['goal']}: {times(r['value'])} ({'met' if r['met'] else 'missed'})" for r in judged)
        out.append(("b", f"{f.phase}, {f.data.get('card', f.card)} ({rel(f.path, root)}): {verdicts or 'no targets'}."))
    if not res.files:
        out.append(("b", "the GPU runs are not measured in this results set (no *-llama-1gpu.json or "
                         "*-llama-4gpu.json): `bash experiments/passes/llama_pass.sh` on one GPU, "
                         "`PHASE=4gpu ...` on four."))
    if res.text is not None:
        c = text_checks(res.text)
        out.append(("b", f"real text on the CPU ({rel(res.text.path, root)}): at step {c['step']} the Llama's "
                         f"validation loss is {c['llama']:.4f}, the GPT's {c['gpt']:.4f} ({c['rel']:+.2%}); a uniform "
                         f"guess scores {c['uniform']:.3f}."))
    else:
        out.append(("b", f"the Llama against the GPT on real text is not measured in this results set: `{TEXT_RUN}`."))
    out.append(("b", "docs/llama.md gives the user's guide and what bounds each miss; experiments/NOTES.md the "
                     "measurements' history."))
    return out


def llama_pages(rep: Report, res: LlamaResults, root: Path) -> None:
    rep.text("9. The Llama", prose(res, root))
    parts = []
    for f in res.files:
        parts += [runs_table(f, root), targets_table(f)]
    if parts:
        rep.tables(parts)
    if res.text is not None:
        rep.tables([text_table(res.text, root)])
        rep.figure(text_figure(res.text), "9. The Llama and the GPT on real text")


def commands(res: LlamaResults, root: Path) -> list[Block]:
    out: list[Block] = [("m", f"{rel(f.path, root)} {name}: {r.get('cmd', '?')}") for f in res.files
                        for name, r in f.data["runs"].items() if isinstance(r, dict)]
    if res.text is not None:
        out.append(("m", f"{rel(res.text.path, root)}: {res.text.data.get('command', '?')}"))
    return out
