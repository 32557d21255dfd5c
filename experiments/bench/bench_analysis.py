"""From bench.py's run records to MFU, bubbles, the issue-#6 target ratios and the closing table.

Pure functions of the records (no GPU, no processes): tests/experiments/test_analysis.py feeds them synthetic runs.
A run record is the program's JSON line plus bench.py's spec fields: config (C/L/X), system (base, peer,
engine), mode (base: practical10; peer: gpipe/1f1b/interleaved/tp/single; engine: its schedule, or single
on one GPU), prec, dp, pp, mp, gpus, variant ("" = the system's default; e.g. "autocast" for the engine's
--amp-impl autocast). A failed run has "error" and no numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

DEFINITIONS = {
    "tflops_per_gpu": "model FLOPs of one step, 6 * batch * dim^2 * depth (biases, recomputation and "
                      "optimizer left out), / median step time / GPUs",
    "mfu": "tflops_per_gpu / the card's datasheet dense peak for prec (hybrid_engine/metrics/flops.py: H100/H200 SXM 989 "
           "TFLOP/s bf16/fp16, 67 TFLOP/s fp32 without TF32, from NVIDIA's H100 and H200 datasheets); null for a "
           "card the table lacks",
    "gemm_fraction": "tflops_per_gpu / gemm_peak_tflops[prec] (the card's own measured N=8192 GEMM, fp32 with TF32 "
                     "off): a fraction of a measured rate, not MFU (it can pass 1)",
    "bubble_simulated": "hybrid_engine.parallel.pipeline.schedule.simulate(make_schedule(mode, pp, micro, v)) with costs "
                        "F=1, B=2, I=W=1 per rank (divided by v chunks): idle share of the makespan; "
                        "the base code is the 'naive' (stop-and-wait) schedule",
    "bubble_measured": "1 - T_ideal / T_step with T_ideal = T_1gpu / pp, T_1gpu the median step time of the "
                       "same system on one GPU (mode single: whole model, same global batch and micro-batches, "
                       "so the same GEMM shapes; the base code uses the peer's single, plain PyTorch too). "
                       "Counts communication and any per-GPU slow-down as bubble",
    "bubble_traced": "engine 1F1B runs at pp > 1 with the driver's --trace: its measured bubble of the last "
                     "step, 1 - mean busy time inside compute actions / the step's span (hybrid_engine/metrics/trace.py); "
                     "the timelines (json, png) are kept in <results>-traces/",
    "bubble_calibrated": "the same schedule simulated with each stage's median measured F, B, I, W durations from "
                         "the trace and no transfer time: the idle time the real (unequal) stages imply; traced over "
                         "calibrated is what the executor adds",
    "scaling_efficiency": "samples_s(dp=2) / (2 * samples_s(1 GPU)), same system, config and precision",
    "weak_scaling_efficiency": "samples_s(dp=2, config Lw: L's batch doubled, so each replica runs L's "
                               "micro-batches) / (2 * samples_s(1 GPU, config L)), same system and precision",
    "engine_best": "for 'engine vs X' ratios: the fastest engine schedule at that config, precision and grid "
                   "(default --amp-impl); ratio_details names it",
}

PIPELINE_MODES = {"naive", "gpipe", "1f1b", "interleaved", "zb1", "practical10"}


def ok(run: dict) -> bool:
    return "error" not in run and "skipped" not in run and run.get("step_ms") is not None


def find(runs: list[dict], **fields) -> Optional[dict]:
    """The first successful run whose fields all match (variant defaults to the system's default)."""
    fields.setdefault("variant", "")
    for run in runs:
        if ok(run) and all(run.get(k) == v for k, v in fields.items()):
            return run
    return None


def best_engine(runs: list[dict], config: str, prec: str, *, dp: int = 1, pp: int = 2, mp: int = 1) -> Optional[dict]:
    candidates = [r for r in runs if ok(r) and r.get("system") == "engine" and r.get("config") == config
                  and r.get("prec") == prec and (r.get("dp"), r.get("pp"), r.get("mp")) == (dp, pp, mp)
                  and r.get("variant", "") == ""]
    return max(candidates, key=lambda r: r["samples_s"], default=None)


def simulated_bubble(mode: str, pp: int, micro: int, virtual_stages: int = 1) -> Optional[float]:
    from hybrid_engine.parallel.pipeline.schedule import Costs, make_schedule, simulate

    name = "naive" if mode == "practical10" else mode
    v = virtual_stages
    try:
        return simulate(make_schedule(name, pp, micro, v), Costs(F=1 / v, B=2 / v, I=1 / v, W=1 / v)).bubble
    except (ValueError, RuntimeError):
        return None


def annotate(runs: list[dict], gemm_peak: dict, card: str = "") -> None:
    """Add mfu, gemm_fraction, bubble_simulated and bubble_measured (see DEFINITIONS) to every successful run, in
    place. card: the device name (meta["card_full"], e.g. "NVIDIA H200") for the datasheet peak."""
    from hybrid_engine.metrics.flops import peak_flops

    for run in runs:
        if not ok(run):
            continue
        peak = gemm_peak.get(run["prec"])
        run["gemm_fraction"] = round(run["tflops_per_gpu"] / peak, 4) if peak else None
        datasheet = peak_flops(card, run["prec"])
        run["mfu"] = round(run["tflops_per_gpu"] * 1e12 / datasheet, 4) if datasheet else None
        if run.get("pp", 1) < 2 or run.get("mode") not in PIPELINE_MODES or run.get("dp", 1) * run.get("mp", 1) != 1:
            continue
        v = 2 if run["mode"] == "interleaved" else 1
        sim = simulated_bubble(run["mode"], run["pp"], run["micro"], v)
        run["bubble_simulated"] = round(sim, 4) if sim is not None else None
        single_system = "peer" if run["system"] == "base" else run["system"]
        single = find(runs, system=single_system, mode="single", config=run["config"], prec=run["prec"],
                      variant=run.get("variant", "") if single_system == run["system"] else "")
        run["bubble_measured"] = (round(1 - single["step_ms"] / (run["pp"] * run["step_ms"]), 4)
                                  if single else None)


@dataclass(frozen=True)
class Target:
    name: str
    op: str  # ">=" or "<="
    goal: float
    compute: Callable[[list[dict], dict], tuple[Optional[float], dict]]


def _speedup(config: str, prec: str, other: dict, engine_grid: dict | None = None):
    def compute(runs, meta):
        grid = engine_grid or {"pp": 2}
        eng = best_engine(runs, config, prec, **grid)
        ref = find(runs, config=config, prec=prec, **other)
        detail = {"engine": _label(eng), "reference": _label(ref)}
        if not eng or not ref:
            return None, detail
        return eng["samples_s"] / ref["samples_s"], detail
    return compute


def _fraction_of_peak(config: str, prec: str):
    def compute(runs, meta):
        eng = best_engine(runs, config, prec)
        peak = meta.get("gemm_peak_tflops", {}).get(prec)
        detail = {"engine": _label(eng), "gemm_peak_tflops": peak}
        if not eng or not peak or eng.get("bubble_simulated") is None:
            return None, detail
        detail["bubble_simulated"] = eng["bubble_simulated"]
        return eng["tflops_per_gpu"] / (peak * (1 - eng["bubble_simulated"])), detail
    return compute


def _bubble_ratio(config: str, prec: str, measured: str = "bubble_measured", simulated: str = "bubble_simulated"):
    def compute(runs, meta):
        eng = find(runs, system="engine", mode="1f1b", config=config, prec=prec, dp=1, pp=2, mp=1)
        detail = {"engine": _label(eng)}
        if not eng or eng.get(measured) is None or not eng.get(simulated):
            return None, detail
        detail.update(measured=eng[measured], simulated=eng[simulated])
        return eng[measured] / eng[simulated], detail
    return compute


def _scaling(config: str, prec: str, dp2_config: Optional[str] = None):
    """dp=2 over 1 GPU; dp2_config names the dp=2 run's config when it differs (weak scaling)."""
    def compute(runs, meta):
        two = find(runs, system="engine", config=dp2_config or config, prec=prec, dp=2, pp=1, mp=1)
        one = find(runs, system="engine", mode="single", config=config, prec=prec)
        detail = {"dp2": _label(two), "one_gpu": _label(one)}
        if not two or not one:
            return None, detail
        return two["samples_s"] / (2 * one["samples_s"]), detail
    return compute


def _label(run: Optional[dict]) -> Optional[str]:
    if run is None:
        return None
    grid = f"dp{run.get('dp', 1)}pp{run.get('pp', 1)}mp{run.get('mp', 1)}"
    variant = f"+{run['variant']}" if run.get("variant") else ""
    return f"{run['system']}:{run['mode']}{variant}:{run['config']}:{run['prec']}:{grid}:{run['samples_s']:.0f}/s"


BASE = {"system": "base", "mode": "practical10", "dp": 1}
PEER_1F1B = {"system": "peer", "mode": "1f1b", "pp": 2}
PEER_TP = {"system": "peer", "mode": "tp", "mp": 2}

TARGETS: list[Target] = [
    Target("L_pp2_fp16_vs_peer_1f1b", ">=", 3.0, _speedup("L", "fp16", PEER_1F1B)),
    Target("L_pp2_fp16_vs_base", ">=", 5.0, _speedup("L", "fp16", BASE)),
    Target("L_pp2_fp32_vs_peer_1f1b", ">=", 1.2, _speedup("L", "fp32", PEER_1F1B)),
    Target("L_pp2_fp32_vs_base", ">=", 2.0, _speedup("L", "fp32", BASE)),
    Target("C_pp2_fp16_vs_peer_1f1b", ">=", 3.0, _speedup("C", "fp16", PEER_1F1B)),
    Target("C_pp2_fp16_vs_base", ">=", 4.0, _speedup("C", "fp16", BASE)),
    Target("X_pp2_fp16_of_peak_x_1_minus_bubble", ">=", 0.8, _fraction_of_peak("X", "fp16")),
    Target("X_pp2_fp16_vs_peer_1f1b", ">=", 1.25, _speedup("X", "fp16", PEER_1F1B)),
    Target("L_pp2_fp16_1f1b_bubble_measured_over_simulated", "<=", 1.15, _bubble_ratio("L", "fp16")),
    Target("L_pp2_fp32_1f1b_bubble_measured_over_simulated", "<=", 1.15, _bubble_ratio("L", "fp32")),
    Target("X_pp2_fp16_1f1b_bubble_measured_over_simulated", "<=", 1.15, _bubble_ratio("X", "fp16")),
    Target("L_pp2_fp16_1f1b_bubble_traced_over_simulated", "<=", 1.15, _bubble_ratio("L", "fp16", "bubble_traced")),
    Target("L_pp2_fp32_1f1b_bubble_traced_over_simulated", "<=", 1.15, _bubble_ratio("L", "fp32", "bubble_traced")),
    Target("X_pp2_fp16_1f1b_bubble_traced_over_simulated", "<=", 1.15, _bubble_ratio("X", "fp16", "bubble_traced")),
    # the same traced bubble over the schedule simulated with each stage's measured action durations: what the
    # executor itself adds (transfers, launches, waits) beyond the idle time the real stages imply
    Target("L_pp2_fp16_1f1b_bubble_traced_over_calibrated", "<=", 1.15,
           _bubble_ratio("L", "fp16", "bubble_traced", "bubble_calibrated")),
    Target("L_pp2_fp32_1f1b_bubble_traced_over_calibrated", "<=", 1.15,
           _bubble_ratio("L", "fp32", "bubble_traced", "bubble_calibrated")),
    Target("X_pp2_fp16_1f1b_bubble_traced_over_calibrated", "<=", 1.15,
           _bubble_ratio("X", "fp16", "bubble_traced", "bubble_calibrated")),
    Target("L_mp2_fp16_vs_peer_tp", ">=", 3.0, _speedup("L", "fp16", PEER_TP, {"pp": 1, "mp": 2})),
    Target("L_mp2_bf16_vs_peer_tp", ">=", 3.0, _speedup("L", "bf16", PEER_TP, {"pp": 1, "mp": 2})),
    Target("L_dp2_fp16_scaling_efficiency", ">=", 0.9, _scaling("L", "fp16")),
    Target("L_dp2_fp16_weak_scaling_efficiency", ">=", 0.9, _scaling("L", "fp16", dp2_config="Lw")),
]


def compute_ratios(runs: list[dict], meta: dict) -> tuple[dict, dict]:
    """({target name: value or None}, {target name: {target, op, met, what it compared}})."""
    ratios, details = {}, {}
    for t in TARGETS:
        value, detail = t.compute(runs, meta)
        ratios[t.name] = round(value, 4) if value is not None else None
        met = None if value is None else (value >= t.goal if t.op == ">=" else value <= t.goal)
        details[t.name] = {"target": f"{t.op} {t.goal:g}", "met": met, **detail}
    return ratios, details


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(runs: list[dict], ratios: dict, details: dict) -> str:
    lines = [f"{'system':6} {'mode':12} {'cfg':3} {'prec':4} {'grid':9} {'step_ms':>9} {'samples/s':>10} "
             f"{'TF/gpu':>7} {'MFU':>5} {'bubble sim/meas/trace':>21} {'peak GiB':>13}"]
    for r in runs:
        grid = f"d{r.get('dp', 1)}p{r.get('pp', 1)}m{r.get('mp', 1)}"
        mode = r.get("mode", "") + (f"+{r['variant']}" if r.get("variant") else "")
        head = f"{r.get('system', ''):6} {mode:12.12} {r.get('config', ''):3} {r.get('prec', ''):4} {grid:9}"
        if not ok(r):
            why = r.get("error") or r.get("skipped") or "no result"
            lines.append(f"{head} {'ERROR' if 'error' in r else 'SKIP'}: {why[:90]}")
            continue
        bub = (f"{_num(r.get('bubble_simulated'), '.3f')}/{_num(r.get('bubble_measured'), '.3f')}/"
               f"{_num(r.get('bubble_traced'), '.3f')}" if "bubble_simulated" in r else "")
        peaks = ",".join(f"{x:.1f}" for x in r.get("peak_gib", []))
        lines.append(f"{head} {r['step_ms']:9.2f} {r['samples_s']:10.0f} {r['tflops_per_gpu']:7.1f} "
                     f"{_num(r.get('mfu'), '.2f'):>5} {bub:>21} {peaks:>13}")
    lines.append("")
    lines.append(f"{'target':48} {'value':>7} {'goal':>7}  met")
    for name, value in ratios.items():
        d = details[name]
        met = {True: "yes", False: "NO", None: "n/a"}[d["met"]]
        lines.append(f"{name:48} {_num(value, '.3f'):>7} {d['target']:>7}  {met}")
    return "\n".join(lines)
