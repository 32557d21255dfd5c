"""Section 8, every 4-GPU grid (dp x pp x mp = 4x1x1, 1x4x1, 1x1x4, 2x2x1, 2x1x2, 1x2x2) beside one GPU running the
same flags, and the GPT beside its peers on the same grids: the files of experiments/passes/grids_pass.sh through
experiments/analysis/grids_results.py, `<date>-<gpus>x<card>-grids-<mlp|gpt>.json` (newest per phase and card).
Every ratio is recomputed here from the two records it compares; a target's verdict is the recomputed value against its goal."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .data import NOT_RUN, finite
from .render import Block, Report
from .tables import DASH, Table, ms, pct, rate, rel, times

NAME = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpus>\d+)x(?P<card>[^-]+)-grids-(?P<phase>mlp|gpt)\.json$")
RUN = "PHASE={phase} bash experiments/passes/grids_pass.sh"
GRID = re.compile(r"(dp|pp|mp|tp)(\d)")


@dataclass
class GridFile:
    path: Path
    card: str
    phase: str
    data: dict


@dataclass
class GridResults:
    files: list[GridFile] = field(default_factory=list)
    used: list[Path] = field(default_factory=list)
    ignored: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def claimed(self) -> set[Path]:
        return set(self.used) | {p for p, _ in self.ignored}


def load_grids(root: Path) -> GridResults:
    out = GridResults()
    found: dict[tuple[str, str], list[tuple[str, GridFile]]] = {}
    for path in sorted(Path(root).glob("*-grids-*.json")):
        m = NAME.match(path.name)
        if not m:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out.ignored.append((path, f"unreadable: {exc}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
            out.ignored.append((path, "a grids file without its 'runs'"))
            continue
        found.setdefault((m["card"], m["phase"]), []).append((m["date"], GridFile(path, m["card"], m["phase"], data)))
    for key in sorted(found, reverse=True):  # H200 before H100, mlp before gpt
        files = sorted(found[key], key=lambda e: (e[0], e[1].path.name))
        out.files.append(files[-1][1])
        out.ignored += [(f.path, "an older grids file of the same phase and card") for _, f in files[:-1]]
    out.files.sort(key=lambda f: (f.card, f.phase != "mlp"), reverse=False)
    out.used = [f.path for f in out.files]
    return out


def per_s(rec: Optional[dict]) -> Optional[float]:
    return float(rec["per_s"]) if isinstance(rec, dict) and finite(rec.get("per_s")) else None


def ratio(f: GridFile, name: str, other: Optional[str]) -> Optional[float]:
    """name's samples or tokens per second over other's, both read from the file's records."""
    a, b = per_s(f.data["runs"].get(name)), per_s(f.data["runs"].get(other)) if other else None
    return a / b if a is not None and b else None


def grid_of(name: str) -> str:
    axes = dict((axis.replace("tp", "mp"), int(n)) for axis, n in GRID.findall(name))
    if not axes:
        return "1 GPU" if "1gpu" in name else DASH
    return " x ".join(f"{a}{axes[a]}" for a in ("dp", "pp", "mp") if a in axes)


def runs_table(f: GridFile, root: Path) -> Table:
    unit = f.data.get("unit", "per s")
    peers = f.data.get("ratios", {})
    cols = ["run", "grid", "GPUs", "step ms", unit, "MFU", "vs 1 GPU (same flags)", "vs peers"]
    t = Table(f"8. Every 4-GPU grid, {f.phase.upper()}, {f.data.get('card', f.card)}", cols, [])
    for name, rec in f.data["runs"].items():
        if per_s(rec) is None:
            t.rows.append([name, grid_of(name)] + [NOT_RUN] * (len(cols) - 2))
            t.shade.append(True)
            continue
        base = (peers.get(name) or {}).get("baseline")
        vs_peers = ", ".join(f"{k[3:]} {times(ratio(f, name, k[3:]))}" for k in (peers.get(name) or {})
                             if k.startswith("vs_") and k != "vs_1gpu")
        t.rows.append([name, grid_of(name), str(rec.get("gpus", "?")), ms(rec.get("step_ms")), rate(rec["per_s"]),
                       pct(rec.get("mfu")), f"{times(ratio(f, name, base))} ({base})" if base else DASH,
                       vs_peers or DASH])
        t.shade.append(False)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', '?')}, torch {f.data.get('torch', '?')}; "
               f"`{RUN.format(phase=f.phase)}`)",
               "vs 1 GPU: this run's rate over the 1-GPU run of the same flags in the same job; vs peers: over the "
               "peer's rate on the same grid; MFU: model FLOPs per GPU over the datasheet peak "
               f"({f.data.get('peak_tflops', '?')} TFLOP/s)."]
    return t


def targets(f: GridFile) -> list[dict]:
    """Each target of the file, its value recomputed from the records it names."""
    out = []
    rel_ = f.data.get("ratios", {})
    for goal, t in (f.data.get("targets") or {}).items():
        m = re.match(r"(?P<cfg>\w+) (?P<grid>\w+) ", goal)
        value = t.get("value")
        if f.phase == "mlp" and m:
            name = f"{m['cfg']}_{m['grid']}"
            value = ratio(f, name, (rel_.get(name) or {}).get("baseline"))
        out.append({"goal": goal, "value": value, "target": t.get("target"),
                    "met": value is not None and finite(t.get("target")) and value >= t["target"]})
    return out


def targets_table(f: GridFile) -> Table:
    t = Table(f"8. The 4-GPU targets, {f.phase.upper()}, {f.data.get('card', f.card)}",
              ["target", "value", "goal", "verdict"], [])
    for r in targets(f):
        t.rows.append([r["goal"], f"{r['value']:.3f}" if finite(r["value"]) else DASH,
                       f"{r['target']}" if finite(r["target"]) else DASH, "met" if r["met"] else "missed"])
        t.shade.append(not r["met"])
    return t


def prose(g: GridResults, root: Path) -> list[Block]:
    out: list[Block] = []
    for f in g.files:
        met = [r for r in targets(f) if r["met"]]
        out.append(("b", f"{f.phase.upper()}, {f.data.get('card', f.card)} ({rel(f.path, root)}): {len(met)} of "
                         f"{len(targets(f))} targets met; experiments/NOTES.md says what bounds each miss."))
    if not g.files:
        out.append(("b", "not measured in this results set (no *-grids-mlp.json or *-grids-gpt.json): one 4-GPU call "
                         "per phase, `PHASE=mlp bash experiments/passes/grids_pass.sh` and `PHASE=gpt ...`."))
    return out


def grid_pages(rep: Report, g: GridResults, root: Path) -> None:
    rep.text("8. Every 4-GPU grid", prose(g, root))
    parts = []
    for f in g.files:
        parts += [runs_table(f, root), targets_table(f)]
    if parts:
        rep.tables(parts)


def commands(g: GridResults, root: Path) -> list[Block]:
    return [("m", f"{rel(f.path, root)} {name}: {r.get('cmd', '?')}") for f in g.files
            for name, r in f.data["runs"].items() if isinstance(r, dict)]
