#!/usr/bin/env python3
"""The Llama pass's logs (experiments/passes/llama_pass.sh) -> one results file and a table with MFU in every row.

    python experiments/analysis/llama_results.py LOG_DIR OUT.json --phase 1gpu|4gpu --card NAME --torch VERSION

Runs are read as grids_results.py reads them (engine: its --metrics file, the median after the warm-up; peers:
their JSON line). The targets (issue 28): on one GPU the engine >= 1.1x plain PyTorch compiled and >= 2x
Megatron-core; on 4 GPUs pp2 x tp2 >= 2x Megatron-core on the same grid; on one GPU at the peers' micro-batches
(issue 38) >= 1.15x plain PyTorch compiled and >= 1.3x Hugging Face transformers compiled. The engine's best run of
a phase at the peers' micro-batches (its 4-micro-batch run is a row, not a contender) is set beside each peer (the
flags of each are in the results file).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grids_results import PEAK_TFLOPS, collect

# phase -> (the engine's runs, {target: (peer run, goal)})
PHASES = {
    "1gpu": (("llama_1gpu", "llama_1gpu_eager", "llama_1gpu_compile", "llama_1gpu_selective"),
             {">= 1.15x plain PyTorch compiled": ("torch_compile_1gpu", 1.15),
              ">= 1.3x Hugging Face compiled": ("hf_compile_1gpu", 1.3),
              ">= 2x Megatron-core (local spec)": ("megatron_1gpu", 2.0),
              "beside plain PyTorch eager": ("torch_1gpu", None)}),
    "4gpu": (("llama_pp2tp2", "llama_pp2tp2_zb1", "llama_pp2tp2_sp", "llama_pp2tp2_compile"),
             {"pp2 x tp2 >= 2x Megatron-core on the same grid": ("megatron_pp2tp2", 2.0)}),
}


def summarize(runs: dict, phase: str) -> dict:
    engine_runs, peers = PHASES[phase]
    timed = {n: runs[n] for n in engine_runs if "per_s" in runs.get(n, {})}
    best = max(timed, key=lambda n: timed[n]["per_s"]) if timed else None
    goals = {}
    for goal, (peer, target) in peers.items():
        value = None
        if best and (runs.get(peer) or {}).get("per_s"):
            value = round(timed[best]["per_s"] / runs[peer]["per_s"], 3)
        goals[goal] = {"engine": best, "peer": peer, "value": value, "target": target,
                       "met": None if target is None else (value is not None and value >= target)}
    return goals


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--phase", choices=tuple(PHASES), required=True)
    p.add_argument("--card", required=True)
    p.add_argument("--torch", required=True)
    a = p.parse_args()
    runs = collect(a.log_dir)
    goals = summarize(runs, a.phase)
    gpus = 1 if a.phase == "1gpu" else 4
    result = {"card": f"{gpus} x {a.card}", "torch": a.torch, "phase": a.phase, "unit": "tokens/s",
              "shape": "Llama hidden 2048, 16 layers, 32 heads, 8 kv heads, ffn 5632, seq 2048, vocab 32000, bf16",
              "peak_tflops": PEAK_TFLOPS, "runs": runs, "targets": goals}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'run':<24} {'gpus':>4} {'step ms':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}")
    for name, r in runs.items():
        if "error" in r:
            print(f"{name:<24} {r['error'][:90]}")
            continue
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "-"
        peak = max(r["peak_gib"]) if isinstance(r.get("peak_gib"), list) and r["peak_gib"] else r.get("peak_gib")
        print(f"{name:<24} {r['gpus']:>4} {r['step_ms']!s:>9} {r['per_s']!s:>10} {r['tflops_per_gpu']!s:>8} "
              f"{mfu:>6} {peak!s:>9}")
    for goal, t in goals.items():
        mark = "INFO" if t["met"] is None else ("MET " if t["met"] else "MISS")
        print(f"{mark} {goal}: {t['engine']} / {t['peer']} = {t['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
