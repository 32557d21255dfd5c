#!/usr/bin/env python3
"""The 4-GPU pass's logs (experiments/passes/grids_pass.sh) -> one results file and a table.

    python experiments/analysis/grids_results.py LOG_DIR OUT.json --phase mlp|gpt --card NAME --torch VERSION

Engine runs are read from their --metrics files: the median step time over the steps after the warm-up, the
samples/s (MLP) or tokens/s (GPT) it gives, model TFLOP/s per GPU and MFU against the card's datasheet peak
(989 TFLOP/s dense fp16/bf16 on H100 and H200 SXM), peak memory, the last loss. Base and peer programs print one
JSON line each. Every grid run is set beside the 1-GPU run of the same flags (SAME_FLAGS) and, for the GPT, beside
its peers on the same grid (PEERS); TARGETS are the issue's goals on those ratios.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hybrid_engine.metrics import records  # noqa: E402

PEAK_TFLOPS = 989.0  # H100 / H200 SXM, dense fp16/bf16

# grid run -> the 1-GPU run with the same flags (its first name that exists)
SAME_FLAGS = {
    **{f"{c}_{g}": f"{c}_1gpu_m1" for c in "LC" for g in ("mp2", "mp4", "dp2mp2", "dp4", "mp2_zb1m",
                                                          "mp2_chunks2", "mp2_chunks2_ctas8", "dp2mp2_trace",
                                                          "dp4_bf16grads")},
    **{f"{c}_{g}": f"{c}_1gpu_m4" for c in "LC" for g in ("pp2mp2", "dp2pp2")},
    **{f"{c}_pp4": f"{c}_1gpu_m8" for c in "LC"},
    "L_base": "L_1gpu_m8",
    **{f"gpt_{g}": "gpt_1gpu" for g in ("dp2pp2", "pp2tp2", "tp4", "pp4", "dp4", "dp2tp2", "tp4_sp",
                                        "pp4_interleaved")},
}
# Variants whose flags differ from every 1-GPU run of the job: set beside the named run, and said so
OTHER_FLAGS = {"gpt_tp4_m2": "gpt_1gpu", "L_mp2_zb1m": "L_mp2"}
PEERS = {"gpt_pp2tp2": ["megatron_pp2tp2"], "gpt_pp4": ["megatron_pp4", "torch_pp4", "torch_pp4_compile"],
         "gpt_tp4": ["megatron_tp4", "dtensor_tp4"]}
GPUS = {"1gpu": 1, "mp2": 2}


def gpus_of(name: str) -> int:
    for key, n in GPUS.items():
        if key in name.split("_"):
            return n
    return 4


def engine_run(path: Path, warmup: int) -> dict:
    steps = records.steps(records.read(path))
    timed = [s for s in steps if s["step"] >= warmup] or steps
    step_s = statistics.median(s["step_time_s"] for s in timed)
    tokens = statistics.median(s["tokens_per_s"] for s in timed)
    tflops = statistics.median(s["tflops_per_gpu"] for s in timed)
    return {"step_ms": round(step_s * 1e3, 3), "per_s": round(tokens, 1), "tflops_per_gpu": round(tflops, 1),
            "mfu": round(tflops / PEAK_TFLOPS, 4), "peak_gib": steps[-1].get("peak_mem_gib"),
            "last_loss": steps[-1]["loss"], "timed_steps": len(timed)}


def program_run(log: Path) -> dict | None:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    if not lines:
        return None
    rec = json.loads(lines[-1])
    per_s = rec.get("tokens_s", rec.get("samples_s"))
    tflops = rec.get("tflops_per_gpu")
    out = {"step_ms": rec.get("step_ms"), "per_s": per_s, "tflops_per_gpu": tflops,
           "mfu": round(tflops / PEAK_TFLOPS, 4) if tflops else None, "peak_gib": rec.get("peak_gib"),
           "last_loss": (rec.get("losses") or [None])[-1], "system": rec.get("system")}
    return out


def collect(res: Path) -> dict:
    runs = {}
    for cmd in sorted(res.glob("*.cmd")):
        name = cmd.stem
        command = cmd.read_text().strip()
        warmup = int(m.group(1)) if (m := re.search(r"--warmup (\d+)", command)) else 0
        rc_file = res / f"{name}.rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else None
        metrics = res / f"{name}.jsonl"
        record = None
        if rc == 0 and metrics.exists():
            record = engine_run(metrics, warmup)
        elif rc == 0:
            record = program_run(res / f"{name}.log")
        if record is None:
            tail = (res / f"{name}.log").read_text().splitlines()[-3:] if (res / f"{name}.log").exists() else []
            runs[name] = {"cmd": command, "error": f"exit {rc}: " + " | ".join(tail)[-400:]}
            continue
        runs[name] = {"cmd": command, "gpus": gpus_of(name), **record}
    for skipped in (res / "skipped.txt").read_text().split() if (res / "skipped.txt").exists() else []:
        runs.setdefault(skipped, {"error": "skipped: the pass's time budget ran out"})
    return runs


def ratios(runs: dict) -> dict:
    out = {}
    for name, base in SAME_FLAGS.items():
        r, b = runs.get(name, {}), runs.get(base, {})
        if "per_s" in r and "per_s" in b:
            rel = {"vs_1gpu": round(r["per_s"] / b["per_s"], 3), "baseline": base}
            if r.get("last_loss") is not None and b.get("last_loss"):
                rel["last_loss_rel_diff"] = round(abs(r["last_loss"] - b["last_loss"]) / abs(b["last_loss"]), 5)
            out[name] = rel
    for name, other in OTHER_FLAGS.items():
        if "per_s" in runs.get(name, {}) and "per_s" in runs.get(other, {}):
            out[name] = {f"vs_{other}": round(runs[name]["per_s"] / runs[other]["per_s"], 3),
                         "note": f"other flags than {other}: a variant, not a same-flags ratio"}
    for name, peers in PEERS.items():
        for peer in peers:
            if "per_s" in runs.get(name, {}) and (runs.get(peer) or {}).get("per_s"):
                out.setdefault(name, {})[f"vs_{peer}"] = round(runs[name]["per_s"] / runs[peer]["per_s"], 3)
    return out


def targets(phase: str, rel: dict) -> dict:
    def target(value, goal):
        return {"value": value, "target": goal, "met": value is not None and value >= goal}

    def get(name, key="vs_1gpu"):
        return rel.get(name, {}).get(key)

    if phase == "mlp":
        out = {}
        for c in "LC":
            out[f"{c} mp2 >= 1.6x one GPU"] = target(get(f"{c}_mp2"), 1.6)
            out[f"{c} mp4 >= 2x one GPU"] = target(get(f"{c}_mp4"), 2.0)
            for g in ("dp4", "pp4", "mp4", "dp2pp2", "dp2mp2", "pp2mp2"):
                out[f"{c} {g} no slower than one GPU"] = target(get(f"{c}_{g}"), 1.0)
        return out
    grids = ("dp2pp2", "pp2tp2", "tp4", "pp4", "dp4", "dp2tp2")
    best = max((get(f"gpt_{g}") or 0.0 for g in grids), default=0.0)
    out = {"best 4-GPU grid >= 85% of 4 x one GPU": target(round(best / 4, 3), 0.85),
           "tp4 >= 70% of 4 x one GPU": target(round((get("gpt_tp4") or 0) / 4, 3), 0.70),
           "pp4 >= 1.3x torch pipelining compiled": target(get("gpt_pp4", "vs_torch_pp4_compile"), 1.3)}
    for g, peer in (("pp2tp2", "megatron_pp2tp2"), ("pp4", "megatron_pp4"), ("tp4", "megatron_tp4")):
        out[f"{g} >= 2x Megatron-core"] = target(get(f"gpt_{g}", f"vs_{peer}"), 2.0)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--phase", choices=("mlp", "gpt"), required=True)
    p.add_argument("--card", required=True)
    p.add_argument("--torch", required=True)
    a = p.parse_args()
    runs = collect(a.log_dir)
    rel = ratios(runs)
    goals = targets(a.phase, rel)
    unit = "samples/s" if a.phase == "mlp" else "tokens/s"
    result = {"card": f"4 x {a.card}", "torch": a.torch, "phase": a.phase, "unit": unit, "peak_tflops": PEAK_TFLOPS,
              "runs": runs, "ratios": rel, "targets": goals}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'run':<22} {'gpus':>4} {'step ms':>9} {unit:>12} {'MFU':>6} {'vs 1 GPU':>9}  vs peers")
    for name, r in runs.items():
        if "error" in r:
            print(f"{name:<22} {r['error'][:90]}")
            continue
        peers = " ".join(f"{k[3:]} {v}" for k, v in rel.get(name, {}).items() if k.startswith("vs_") and k != "vs_1gpu")
        vs = rel.get(name, {}).get("vs_1gpu", "")
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "-"
        print(f"{name:<22} {r['gpus']:>4} {r['step_ms']:>9} {r['per_s']:>12} {mfu:>6} {vs!s:>9}  {peers}")
    for goal, t in goals.items():
        print(f"{'MET ' if t['met'] else 'MISS'} {goal}: {t['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
