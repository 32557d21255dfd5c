"""Reading experiments/results/: bench files, max-batch logs, convergence curves and pipeline traces.

Everything the report prints comes through here, from files; nothing is typed in. File names follow
`<date>-<gpus>x<card>[-maxbatch|-convergence].<ext>` (experiments/README.md). Where several files exist for
one card, the newest (by date, then name) is used; every file read is recorded in `Results.files_used`.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

NAME = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpus>\d+)x(?P<card>.+?)(?:-(?P<kind>maxbatch|convergence))?\.jsonl?$")
NOT_RUN = "not run"
FAILED = "failed"
NOT_MEASURED = "not measured in this results set"


def ok(run: dict) -> bool:
    """A run that produced numbers (same rule as experiments/bench/bench_analysis.ok)."""
    return "error" not in run and "skipped" not in run and run.get("step_ms") is not None


def status(run: dict) -> str:
    """'ok', 'not run' or 'failed': what a table shows for a run that has no numbers."""
    if "error" in run:
        return FAILED
    if "skipped" in run or run.get("step_ms") is None:
        return NOT_RUN
    return "ok"


def why(run: dict) -> str:
    """The reason a run has no numbers, one line."""
    text = run.get("error") or run.get("skipped") or ""
    return str(text).strip().splitlines()[0][:80] if str(text).strip() else ""


def grid_of(run: dict) -> tuple[int, int, int]:
    return int(run.get("dp", 1)), int(run.get("pp", 1)), int(run.get("mp", 1))


def grid_text(run: dict) -> str:
    dp, pp, mp = grid_of(run)
    return f"dp{dp}pp{pp}mp{mp}"


def mode_text(run: dict) -> str:
    return run.get("mode", "?") + (f"+{run['variant']}" if run.get("variant") else "")


@dataclass
class Trace:
    """One measured pipeline step (hybrid_engine/metrics/trace.py): per rank (type, stage, micro, start_ms, end_ms)."""
    name: str  # e.g. L_fp16_1f1b_pp2
    path: Path
    rows: list[list[tuple[str, int, int, float, float]]]
    summary: dict  # otherData: schedule, pp, micro_batches, measured_bubble, simulated_bubble
    png: Optional[Path] = None


@dataclass
class Bench:
    path: Path
    card: str
    date: str
    meta: dict
    runs: list[dict]
    ratios: dict
    details: dict
    traces: list[Trace] = field(default_factory=list)

    def find(self, **fields: Any) -> Optional[dict]:
        """The first run (ok or not) whose fields all match; variant defaults to ''."""
        fields.setdefault("variant", "")
        return next((r for r in self.runs if all(r.get(k, "" if k == "variant" else None) == v
                                                  for k, v in fields.items())), None)

    def index(self, run: dict) -> int:
        """The run's position in the file's runs[] (what tables cite as #)."""
        return next(i for i, r in enumerate(self.runs) if r is run)


@dataclass
class MaxBatch:
    path: Path
    card: str
    results: dict[str, dict]  # mode -> the newest "result" line of that mode
    trials: list[dict]
    ratios: Optional[dict]  # the last "ratios" line
    shape: str = ""  # "schedule, m=micro-batches" of the search
    # Searches of other shapes in the same file (e.g. GPipe beside 1F1B), each with its own ratios
    others: list["MaxBatch"] = field(default_factory=list)


@dataclass
class Convergence:
    path: Path
    card: str
    curves: dict[str, list[float]]  # name (fp32, fp16, ...) -> loss per step
    extra: dict  # scalar fields of the file, shown as notes


@dataclass
class Results:
    root: Path
    benches: list[Bench]  # newest per card, newest card first
    maxbatch: dict[str, MaxBatch]  # card -> newest
    convergence: dict[str, Convergence]  # card -> newest
    files_used: list[Path]
    files_ignored: list[tuple[Path, str]]


def _name_parts(path: Path) -> tuple[str, str]:
    m = NAME.match(path.name)
    return (m["date"], m["card"]) if m else ("", path.stem)


def _newest(items: list[tuple[str, str, Path, Any]]) -> dict[str, tuple[Path, Any]]:
    """(date, card, path, payload) -> card -> newest (path, payload)."""
    best: dict[str, tuple[str, str, Path, Any]] = {}
    for date, card, path, payload in items:
        if card not in best or (date, path.name) > (best[card][0], best[card][2].name):
            best[card] = (date, card, path, payload)
    return {card: (v[2], v[3]) for card, v in best.items()}


def read_trace(path: Path) -> Optional[Trace]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        return None
    ranks = 1 + max(int(e.get("tid", 0)) for e in events)
    rows: list[list[tuple[str, int, int, float, float]]] = [[] for _ in range(ranks)]
    for e in events:
        args = e.get("args", {})
        rows[int(e.get("tid", 0))].append((e.get("cat", "?"), int(args.get("stage", 0)), int(args.get("micro", 0)),
                                           e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    png = path.with_suffix(".png")
    return Trace(path.stem, path, rows, data.get("otherData", {}), png if png.exists() else None)


def _read_bench(path: Path, data: dict) -> Bench:
    meta = data.get("meta", {})
    date, card = _name_parts(path)
    bench = Bench(path, str(meta.get("card") or card), str(meta.get("date") or date), meta, data.get("runs", []),
                  data.get("ratios", {}) or {}, data.get("ratio_details", {}) or {})
    trace_dir = path.with_name(path.stem + "-traces")
    if trace_dir.is_dir():
        bench.traces = [t for t in map(read_trace, sorted(trace_dir.glob("*.json"))) if t is not None]
    return bench


def _read_maxbatch(path: Path) -> MaxBatch:
    """One file may hold searches of several shapes (schedule, micro-batch count), appended one after another: the
    first shape is the primary MaxBatch, each later one goes to its `others`. A line that names no shape belongs
    to the search in progress (or, before any, to the first)."""
    groups: dict[str, MaxBatch] = {}
    current: Optional[MaxBatch] = None
    unplaced: list[dict] = []

    def place(rec: dict, search: MaxBatch) -> None:
        kind = rec.get("kind")
        if kind == "trial":
            search.trials.append(rec)
        elif kind == "result" and rec.get("mode"):
            search.results[rec["mode"]] = rec
        elif kind == "ratios":
            search.ratios = rec

    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a killed run: skip it, keep the rest
        found = re.search(r"--schedule (\S+)", rec.get("cmd", ""))
        schedule = rec.get("schedule") or (found[1] if found else None)
        if schedule is not None and "micro_batches" in rec:
            shape = f"{schedule}, m={rec['micro_batches']}"
            if shape not in groups:
                groups[shape] = MaxBatch(path, _name_parts(path)[1], {}, [], None, shape)
            current = groups[shape]
            for earlier in unplaced:
                place(earlier, current)
            unplaced = []
        if current is None:
            unplaced.append(rec)
        else:
            place(rec, current)
    if current is None:
        current = groups.setdefault("", MaxBatch(path, _name_parts(path)[1], {}, [], None))
        for rec in unplaced:
            place(rec, current)
    first, *rest = groups.values()
    first.others = rest
    return first


def _numbers(value: Any) -> Optional[list[float]]:
    """A loss curve: a list of numbers, or of [step, loss] pairs, or of {"loss": x} records."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for v in value:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            out.append(float(v[1]))
        elif isinstance(v, dict) and isinstance(v.get("loss"), (int, float)):
            out.append(float(v["loss"]))
        else:
            return None
    return out


def read_convergence(path: Path) -> Optional[Convergence]:
    """Lenient: curves are the list-valued fields of the top level or of a 'curves'/'losses' object."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return None
    source = data.get("curves") if isinstance(data.get("curves"), dict) else (
        data.get("losses") if isinstance(data.get("losses"), dict) else data)
    curves = {str(k): c for k, v in source.items() if (c := _numbers(v)) is not None}
    extra = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) and k not in curves}
    if isinstance(data.get("meta"), dict):
        extra.update({k: v for k, v in data["meta"].items() if isinstance(v, (str, int, float, bool))})
    return Convergence(path, _name_parts(path)[1], curves, extra) if curves else None


def is_bench(data: Any) -> bool:
    """A bench results file (experiments/analysis/ of the pipeline passes): its "meta" and its "runs", each run naming
    the system it measured. Other passes' files may have both keys (the graphs pass's) without being one."""
    return (isinstance(data, dict) and isinstance(data.get("meta"), dict) and isinstance(data.get("runs"), list)
            and all(isinstance(r, dict) and "system" in r for r in data["runs"]))


def load(root: Path) -> Results:
    root = Path(root)
    benches, maxbatches, convergences = [], [], []
    ignored: list[tuple[Path, str]] = []
    for path in sorted(root.glob("*.json*")):
        date, card = _name_parts(path)
        try:
            if path.name.endswith("-maxbatch.jsonl"):
                maxbatches.append((date, card, path, _read_maxbatch(path)))
                continue
            if path.name.endswith("-convergence.json"):
                conv = read_convergence(path)
                if conv is None:
                    ignored.append((path, "no loss curves found"))
                else:
                    convergences.append((date, card, path, conv))
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            ignored.append((path, f"unreadable: {exc}"))
            continue
        if is_bench(data):
            bench = _read_bench(path, data)
            benches.append((bench.date, bench.card, path, bench))
        else:
            ignored.append((path, "not a bench results file"))
    newest_bench = _newest(benches)
    chosen = sorted((b for _, b in newest_bench.values()), key=lambda b: (b.date, b.path.name), reverse=True)
    used_paths = {p for p, _ in newest_bench.values()}
    ignored += [(p, "an older bench file of the same card") for _, _, p, _ in benches if p not in used_paths]
    mb = {card: v for card, (_, v) in _newest(maxbatches).items()}
    conv = {card: v for card, (_, v) in _newest(convergences).items()}
    ignored += [(p, "an older file of the same card") for items, kept in ((maxbatches, mb), (convergences, conv))
                for _, card, p, _ in items if kept[card].path != p]
    used = [b.path for b in chosen] + [t.path for b in chosen for t in b.traces]
    used += [m.path for m in mb.values()] + [c.path for c in conv.values()]
    return Results(root, chosen, mb, conv, used, ignored)


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
