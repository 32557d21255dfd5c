"""The report's tables as data: every cell is a string computed from one run record (or a ratio of two records
of the same results file). Rows carry the run's index in the file's runs[] ('#') so each number can be traced.

A run without numbers shows as 'not run' (skipped) or 'failed' (error) in every numeric cell, never as a number.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .data import (FAILED, NOT_RUN, Bench, Convergence, MaxBatch, Results, finite, grid_of, grid_text, mode_text,
                  ok, status, why)

PRECS = ("fp16", "fp32", "bf16")
SYSTEMS = ("base", "peer", "engine")
MODES = ("practical10", "naive", "gpipe", "1f1b", "interleaved", "zb1", "single", "dp", "tp")
DASH = "–"  # defined but not applicable (e.g. no 1-GPU reference for a measured bubble)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    shade: list[bool] = field(default_factory=list)  # per row: grey (not run / failed)

    def column(self, name: str) -> list[str]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]


def rate(x) -> str:
    return f"{x:,.0f}" if finite(x) else DASH


def ms(x) -> str:
    return f"{x:.2f}" if finite(x) else DASH


def times(x) -> str:
    return f"{x:.2f}x" if finite(x) else DASH


def frac(x) -> str:
    return f"{x:.3f}" if finite(x) else DASH


def pct(x) -> str:
    return f"{x:.1%}" if finite(x) else DASH


def gib(x) -> str:
    return f"{x:.1f}" if finite(x) else DASH


def source(bench: Bench, root: Path) -> str:
    return f"source: {rel(bench.path, root)} (# = index in its runs[])"


def rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve().parent.parent))
    except ValueError:
        return str(path)


def _order(run: dict) -> tuple:
    def pos(seq, x):
        return seq.index(x) if x in seq else len(seq)
    return (pos(PRECS, run.get("prec")), grid_of(run), pos(SYSTEMS, run.get("system")), pos(MODES, run.get("mode")),
            run.get("variant", ""))


def _by_config(bench: Bench, keep: Callable[[dict], bool]) -> list[dict]:
    configs = list(bench.meta.get("configs", {}))
    runs = [r for r in bench.runs if keep(r)]
    return sorted(runs, key=lambda r: (configs.index(r["config"]) if r.get("config") in configs else 99, _order(r)))


def _blank(run: dict, n: int) -> list[str]:
    return [status(run)] * n


def _ref(bench: Bench, run: dict, **fields) -> Optional[dict]:
    dp, pp, mp = grid_of(run)
    return bench.find(config=run.get("config"), prec=run.get("prec"), dp=dp, pp=pp, mp=mp, **fields)


def _speedup(run: dict, ref: Optional[dict]) -> str:
    if ref is None:
        return DASH
    if ref is run:
        return "1.00x"
    if not ok(ref):
        return f"ref {status(ref)}"
    if not same_source(run, ref):
        return OTHER_JOB
    return times(run["samples_s"] / ref["samples_s"])


# A merged results file names each run's source file; runs of different jobs are never divided by each other.
OTHER_JOB = "other job"


def same_source(a: dict, b: dict) -> bool:
    return a.get("source") == b.get("source")


def pipeline_table(bench: Bench, root: Path) -> Table:
    """Throughput of every pipeline run (pp >= 2): base vs peer vs engine schedules per config and precision."""
    cols = ["#", "cfg", "prec", "grid", "system", "schedule", "step ms", "samples/s", "x base", "x peer 1F1B",
            "TFLOP/s/GPU", "MFU", "of GEMM"]
    t = Table(f"Throughput of the pipeline runs (pp >= 2), {bench.card}", cols, [])
    for run in _by_config(bench, lambda r: grid_of(r)[1] >= 2):
        head = [str(bench.index(run)), run.get("config", "?"), run.get("prec", "?"), grid_text(run),
                run.get("system", "?"), mode_text(run)]
        if not ok(run):
            t.rows.append(head + _blank(run, 7))
            t.shade.append(True)
            continue
        base = _ref(bench, run, system="base", mode="practical10")
        peer = _ref(bench, run, system="peer", mode="1f1b")
        t.rows.append(head + [ms(run["step_ms"]), rate(run["samples_s"]), _speedup(run, base), _speedup(run, peer),
                              f"{run['tflops_per_gpu']:.1f}", pct(run.get("mfu")), pct(run.get("gemm_fraction"))])
        t.shade.append(False)
    peak = bench.meta.get("gemm_peak_tflops", {})
    t.notes = [source(bench, root),
               "x base / x peer 1F1B: samples/s over the base code's / the peer's 1F1B samples/s at the same config, "
               "precision and grid, same file.",
               "MFU: model TFLOP/s/GPU over the card's datasheet dense peak (H100/H200 SXM: 989 TFLOP/s fp16/bf16, "
               "67 fp32; hybrid_engine/metrics/flops.py). of GEMM: over the card's measured N=8192 GEMM rate instead: "
               + ", ".join(f"{k} {v:g}" for k, v in peak.items()) + " TFLOP/s (meta.gemm_peak_tflops), not MFU."]
    return t


def bubble_table(bench: Bench, root: Path) -> Table:
    cols = ["#", "cfg", "prec", "grid", "system", "schedule", "simulated", "measured (vs 1 GPU)", "traced",
            "traced / simulated"]
    t = Table(f"Pipeline bubble: simulated, measured and traced, {bench.card}", cols, [])
    for run in _by_config(bench, lambda r: grid_of(r)[1] >= 2):
        head = [str(bench.index(run)), run.get("config", "?"), run.get("prec", "?"), grid_text(run),
                run.get("system", "?"), mode_text(run)]
        if not ok(run):
            t.rows.append(head + _blank(run, 4))
            t.shade.append(True)
            continue
        sim, traced = run.get("bubble_simulated"), run.get("bubble_traced")
        t.rows.append(head + [frac(sim), frac(run.get("bubble_measured")), frac(traced),
                              frac(traced / sim) if finite(traced) and finite(sim) and sim else DASH])
        t.shade.append(False)
    defs = bench.meta.get("definitions", {})
    negative = [r for r in bench.runs if ok(r) and finite(r.get("bubble_measured")) and r["bubble_measured"] < 0]
    t.notes = [source(bench, root)] + beyond_ideal_note(bench, negative) + [f"{k}: {defs[k]}" for k in
                                                     ("bubble_simulated", "bubble_measured", "bubble_traced") if k in defs]
    return t


def one_gpu_reference(bench: Bench, run: dict) -> Optional[dict]:
    """The 1-GPU run a 2-GPU run is compared with: the same system's 'single' (base: the peer's, plain PyTorch)."""
    system = "peer" if run.get("system") == "base" else run.get("system")
    variant = run.get("variant", "") if system == run.get("system") else ""
    return bench.find(system=system, mode="single", config=run.get("config"), prec=run.get("prec"), variant=variant)


def beyond_ideal_note(bench: Bench, runs: list[dict]) -> list[str]:
    """Why a run beats pp x its 1-GPU reference (negative measured bubble, efficiency > 100%): the flags the
    run's command has and its reference's command lacks."""
    notes = []
    for run in runs:
        one = one_gpu_reference(bench, run)
        if one is None or not ok(one):
            continue
        def flags(r: dict) -> list[str]:
            return [f.split("=")[0] for f in str(r.get("cmd", "")).split() if f.startswith("--")]
        skip = {"--schedule", "--master_port", "--nproc_per_node", "--trace", "--metrics", "--dp", "--pp", "--mp"}
        extra = [f for f in flags(run) if f not in flags(one) and f not in skip]
        flags = f"; its command has {' '.join(extra)}, the reference's has not" if extra else ""
        notes.append(f"#{bench.index(run)} is more than {run['gpus']}x faster than its 1-GPU reference "
                     f"#{bench.index(one)} ({run['step_ms']:.2f} vs {one['step_ms']:.2f} ms per step){flags}.")
    return notes


def scaling_table(bench: Bench, root: Path) -> Table:
    cols = ["#", "system", "mode", "cfg", "prec", "grid", "1-GPU ref #", "1 GPU samples/s", "2 GPUs samples/s",
            "speedup", "efficiency"]
    t = Table(f"Strong scaling 1 -> 2 GPUs (same global batch), {bench.card}", cols, [])
    for run in _by_config(bench, lambda r: r.get("gpus") == 2):
        one = one_gpu_reference(bench, run)
        if one is None:
            continue
        row = [str(bench.index(run)), run["system"], mode_text(run), run.get("config", "?"), run.get("prec", "?"),
               grid_text(run), str(bench.index(one))]
        row.append(rate(one["samples_s"]) if ok(one) else status(one))
        row.append(rate(run["samples_s"]) if ok(run) else status(run))
        if ok(run) and ok(one) and not same_source(run, one):
            row += [OTHER_JOB] * 2
        elif ok(run) and ok(one):
            s = run["samples_s"] / one["samples_s"]
            row += [times(s), pct(s / 2)]
        else:
            row += [status(run) if not ok(run) else f"ref {status(one)}"] * 2
        t.rows.append(row)
        t.shade.append(not (ok(run) and ok(one)))
    superlinear = [bench.runs[int(row[0])] for row in t.rows if row[-1].endswith("%") and float(row[-1][:-1]) > 100]
    t.notes = [source(bench, root)] + beyond_ideal_note(bench, superlinear) + [
               "efficiency = samples/s on 2 GPUs / (2 x samples/s on 1 GPU) "
               f"({bench.meta.get('definitions', {}).get('scaling_efficiency', 'meta.definitions.scaling_efficiency')}).",
               "The base code has no 1-GPU mode of its own: its reference is the peer's single (plain PyTorch)."]
    return t


def tp_table(bench: Bench, root: Path) -> Table:
    cols = ["prec", "peer # ", "DTensor TP samples/s", "engine #", "engine TP samples/s", "engine / DTensor",
            "DTensor peak GiB", "engine peak GiB"]
    t = Table(f"Tensor parallelism mp=2: engine vs torch DTensor, config L, {bench.card}", cols, [])
    for prec in PRECS:
        peer = bench.find(system="peer", mode="tp", prec=prec, config="L")
        eng = bench.find(system="engine", mode="tp", prec=prec, config="L")
        if peer is None and eng is None:
            continue
        cells = [prec]
        for run in (peer, eng):
            cells += [str(bench.index(run)) if run else DASH,
                      rate(run["samples_s"]) if run and ok(run) else (status(run) if run else DASH)]
        both = peer is not None and eng is not None and ok(peer) and ok(eng)
        cells.append((times(eng["samples_s"] / peer["samples_s"]) if same_source(eng, peer) else OTHER_JOB)
                     if both else NOT_RUN)
        cells += [gib(max(r["peak_gib"])) if r and ok(r) else DASH for r in (peer, eng)]
        t.rows.append(cells)
        t.shade.append(not both)
    t.notes = [source(bench, root)]
    return t


def runs_table(bench: Bench, root: Path) -> Table:
    """Every run of the file, in file order: status, throughput, MFU and peak memory per rank."""
    cols = ["#", "system", "mode", "cfg", "prec", "grid", "batch", "status", "samples/s", "TFLOP/s/GPU", "MFU",
            "peak GiB per rank"]
    t = Table(f"Every run of the results file: peak memory per rank, {bench.card}", cols, [])
    for i, run in enumerate(bench.runs):
        batch = (bench.meta.get("configs", {}).get(run.get("config"), {}) or {}).get("batch", run.get("batch"))
        head = [str(i), run.get("system", "?"), mode_text(run), run.get("config", "?"), run.get("prec", "?"),
                grid_text(run), str(batch) if batch else DASH]
        if not ok(run):
            t.rows.append(head + [f"{status(run)}: {why(run)}"[:40]] + [status(run)] * 4)
            t.shade.append(True)
            continue
        peaks = " / ".join(gib(x) for x in run.get("peak_gib", []))
        t.rows.append(head + ["ok", rate(run["samples_s"]), f"{run['tflops_per_gpu']:.1f}", pct(run.get("mfu")), peaks])
        t.shade.append(False)
    t.notes = [source(bench, root),
               "peak GiB: torch.cuda.max_memory_allocated of each rank (GPU) after the timed steps."]
    return t


def maxbatch_table(mb: MaxBatch, root: Path) -> Table:
    cols = ["mode", "max batch", "first failure", "converged", "peak GiB at max", "x fp32", "target", "met", "trials"]
    t = Table(f"Largest global batch without OOM at pp=2, {mb.card}", cols, [])
    searches = [mb, *mb.others]
    for search in searches:
        ratios = search.ratios or {}
        base = (search.results.get("fp32") or {}).get("max_batch")
        for mode, res in search.results.items():
            r = ratios.get(f"{mode}_over_fp32") or {}
            label = f"{mode} ({search.shape})" if len(searches) > 1 else mode
            if "skipped" in res:
                t.rows.append([label] + [NOT_RUN] * 4 + [DASH, r.get("target", DASH), DASH, "0"])
                t.shade.append(True)
                continue
            best = res.get("max_batch")
            ratio = best / base if finite(best) and finite(base) and base else None
            met = {True: "yes", False: "NO"}.get(r.get("met"), DASH)
            t.rows.append([label, f"{best:,}" if finite(best) else FAILED,
                           f"{res['first_failure']:,}" if finite(res.get("first_failure")) else DASH,
                           "yes" if res.get("converged") else f"no ({res.get('reason', '')[:30]})",
                           gib(res.get("peak_gib_at_max")), times(ratio) if mode != "fp32" else "1.00x",
                           r.get("target", DASH), met, str(res.get("trials", DASH))])
            t.shade.append(not finite(best))
    shape = next(iter(mb.results.values()), {})
    t.notes = [f"source: {rel(mb.path, root)} (newest 'result' line per mode and search shape; ratios lines for "
               f"target / met)",
               "shape: " + ", ".join(f"{k}={shape.get(k)}" for k in ("dim", "depth", "pp", "micro_size", "card")
                                     if shape.get(k) is not None)
               + "; searches: " + "; ".join(search.shape for search in searches)]
    return t


def targets_table(bench: Bench, mb: Optional[MaxBatch], root: Path) -> Table:
    cols = ["target", "value", "goal", "met", "compared"]
    t = Table(f"Issue-#6 targets, {bench.card}", cols, [])
    for name, value in bench.ratios.items():
        d = bench.details.get(name, {})
        met = {True: "yes", False: "NO"}.get(d.get("met"), "n/a")
        what = "; ".join(str(v) for k, v in d.items() if k not in ("target", "met") and v is not None)
        t.rows.append([name, frac(value) if finite(value) else NOT_RUN, d.get("target", DASH), met, what[:95]])
        t.shade.append(not finite(value))
    for search in ([mb, *mb.others] if mb else []):
        for name, r in (search.ratios or {}).items():
            if isinstance(r, dict) and "target" in r:
                met = {True: "yes", False: "NO"}.get(r.get("met"), "n/a")
                t.rows.append([f"maxbatch_{name} ({search.shape})",
                               frac(r.get("value")) if finite(r.get("value")) else NOT_RUN, r["target"], met,
                               rel(search.path, root)])
                t.shade.append(not finite(r.get("value")))
    t.notes = [f"source: {rel(bench.path, root)} (ratios, ratio_details)"
               + (f" and {rel(mb.path, root)} (ratios line)" if mb else "")]
    return t


def convergence_table(conv: Convergence, root: Path) -> Table:
    cols = ["curve", "steps", "first loss", "last loss", "min loss", "last vs fp32"]
    t = Table(f"Loss curves, {conv.card}", cols, [])
    ref = conv.curves.get("fp32")
    for name, curve in conv.curves.items():
        diff = (f"{(curve[-1] - ref[-1]) / ref[-1]:+.2%}" if ref and ref[-1] and name != "fp32" else DASH)
        t.rows.append([name, str(len(curve)), f"{curve[0]:.6g}", f"{curve[-1]:.6g}", f"{min(curve):.6g}", diff])
        t.shade.append(False)
    t.notes = [f"source: {rel(conv.path, root)}"]
    return t


def files_table(results: Results) -> Table:
    t = Table("Files used", ["file", "bytes", "sha256 (12)"], [])
    for path in results.files_used:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        t.rows.append([rel(path, results.root), f"{path.stat().st_size:,}", digest])
        t.shade.append(False)
    by_reason: dict[str, list] = {}
    for path, reason in results.files_ignored:  # one row a reason: the files this report does not read
        by_reason.setdefault(reason, []).append(path)
    for reason, paths in by_reason.items():
        first = rel(paths[0], results.root)
        name = first if len(paths) == 1 else f"{len(paths)} files, the first {first}"
        t.rows.append([name, "not used", reason])
        t.shade.append(True)
    return t


def commands(bench: Bench) -> list[str]:
    """One line per run: '#i system mode cfg prec grid: the exact command' (or why it did not run)."""
    lines = []
    for i, run in enumerate(bench.runs):
        head = f"#{i} {run.get('system')} {mode_text(run)} {run.get('config')} {run.get('prec')} {grid_text(run)}"
        body = run.get("cmd") or f"{status(run)}: {why(run)}"
        lines.append(f"{head}: {body}")
    return lines
