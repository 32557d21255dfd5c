#!/usr/bin/env python3
"""The kernels pass's logs (experiments/passes/kernels_pass.sh) -> one results file and a table.

    python experiments/analysis/kernels_results.py LOG_DIR OUT.json --card NAME --torch VERSION \
        --shape-1b FLAGS --shape-8b FLAGS

Runs are read as grids_results.py reads them (each run's --metrics file, the median after the warm-up). Ratios:
the 1B shape's fused kernels on against off, the 8B shape's fp8 runs against bf16 (issue 38's target: fp8 >= 1.3x
bf16 tokens/s), each with the relative difference of their last losses. MFU is against the bf16 dense peak.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grids_results import PEAK_TFLOPS, collect

# run -> (its baseline, target or None)
RATIOS = {"llama1b_fused_on": ("llama1b_fused_off", None),
          "llama8b_fp8_tensorwise": ("llama8b_bf16", 1.3),
          "llama8b_fp8_rowwise": ("llama8b_bf16", 1.3)}


def ratios(runs: dict, table: dict = RATIOS) -> dict:
    """Each run of `table` ({run: (its baseline, target or None)}) against its baseline: tokens/s, peak memory and
    the last losses."""
    out = {}
    for name, (base, target) in table.items():
        r, b = runs.get(name, {}), runs.get(base, {})
        if "per_s" in r and "per_s" in b:
            value = round(r["per_s"] / b["per_s"], 3)
            out[name] = {"vs": base, "tokens_per_s_ratio": value, "target": target,
                         "met": None if target is None else value >= target,
                         "peak_gib_ratio": round(max(r["peak_gib"]) / max(b["peak_gib"]), 3)
                         if r.get("peak_gib") and b.get("peak_gib") else None,
                         "last_loss_rel_diff": round(abs(r["last_loss"] - b["last_loss"]) / abs(b["last_loss"]), 5)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--shape-1b", required=True)
    p.add_argument("--shape-8b", required=True)
    a = p.parse_args()
    runs = collect(a.log_dir)
    for run in runs.values():
        run.pop("gpus", None)  # the command says: --nproc_per_node
    result = {"card": a.card, "torch": a.torch, "unit": "tokens/s", "peak_tflops": PEAK_TFLOPS,
              "shape_1b": a.shape_1b, "shape_8b": a.shape_8b, "runs": runs, "ratios": ratios(runs)}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'run':<24} {'step ms':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} {'loss':>8}")
    for name, r in runs.items():
        if "per_s" not in r:
            print(f"{name:<24} {r.get('error', '')[:80]}")
            continue
        peak = max(r["peak_gib"]) if r.get("peak_gib") else float("nan")
        print(f"{name:<24} {r['step_ms']:>9.1f} {r['per_s']:>10.1f} {r['tflops_per_gpu']:>8.1f} {r['mfu']:>6.3f} "
              f"{peak:>9.2f} {r['last_loss']:>8.4f}")
    for name, r in result["ratios"].items():
        print(f"{name} / {r['vs']}: {r['tokens_per_s_ratio']}x tokens/s"
              + (f" (target {r['target']}x: {'met' if r['met'] else 'missed'})" if r["target"] else "")
              + f", peak memory {r['peak_gib_ratio']}x, last loss differs by {r['last_loss_rel_diff']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
