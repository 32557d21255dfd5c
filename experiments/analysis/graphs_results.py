#!/usr/bin/env python3
"""The graphs pass's sweeps (experiments/passes/graphs_pass.sh) -> one results file and a table.

    python experiments/analysis/graphs_results.py OUT.json --card NAME --torch VERSION SWEEP.json...

Each sweep (experiments/bench/graphs_sweep.py) holds runs of one world size: grid, config, micro-batches, graphs
off or on, median step. Per grid and config: the step with graphs on against off, their last losses' relative
difference, and each run's speed against one GPU at the same micro-batches (the targets for config L:
pp4 >= 2.5x one GPU, mp4 >= 2x).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGETS = {("L", "dp1 pp4 mp1"): 2.5, ("L", "dp1 pp1 mp4"): 2.0}


def compare(runs: list[dict]) -> list[dict]:
    by_key = {(r["grid"], r["config"], r["micro_batches"], r["graphs"]): r for r in runs if "error" not in r}
    one_gpu = {(r["config"], r["micro_batches"], r["graphs"]): r for r in runs if r["grid"] == "dp1 pp1 mp1"}
    rows = []
    for (grid, config, m, mode), off in sorted(by_key.items()):
        if mode != "off" or (grid, config, m, "on") not in by_key:
            continue
        on = by_key[(grid, config, m, "on")]
        off_ms, on_ms = off["median_step_ms"], on["median_step_ms"]
        row = {"grid": grid, "config": config, "micro_batches": m, "off_ms": round(off_ms, 3),
               "on_ms": round(on_ms, 3), "on_speedup": round(off_ms / on_ms, 3),
               "graphed": on.get("graphed"),
               "last_loss_rel_diff": abs(on["last_loss"] - off["last_loss"]) / max(abs(off["last_loss"]), 1e-30)}
        for which in ("off", "on"):  # a grid's step covers the same global batch as the one GPU's
            single = one_gpu.get((config, m, which))
            if single is not None and grid != "dp1 pp1 mp1":
                mine = by_key[(grid, config, m, which)]["median_step_ms"]
                row[f"vs_1gpu_{which}"] = round(single["median_step_ms"] / mine, 3)
        target = TARGETS.get((config, grid))
        if target is not None and "vs_1gpu_on" in row:
            row["target_vs_1gpu"], row["met"] = target, row["vs_1gpu_on"] >= target
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("sweeps", nargs="+")
    p.add_argument("--card", default="")
    p.add_argument("--torch", default="")
    args = p.parse_args()
    runs = [r for path in args.sweeps if Path(path).exists() for r in json.loads(Path(path).read_text())]
    rows = compare(runs)
    Path(args.out).write_text(json.dumps({"meta": {"card": args.card, "torch": args.torch}, "runs": runs,
                                          "comparisons": rows}, indent=1))
    print(f"{'grid':<14}{'cfg':<4}{'m':>3}{'off ms':>10}{'on ms':>10}{'on/off':>8}{'vs 1 GPU off':>14}"
          f"{'vs 1 GPU on':>13}")
    nan = float("nan")
    for r in rows:
        print(f"{r['grid']:<14}{r['config']:<4}{r['micro_batches']:>3}{r['off_ms']:>10.2f}{r['on_ms']:>10.2f}"
              f"{r['on_speedup']:>7.2f}x{r.get('vs_1gpu_off', nan):>13.2f}x{r.get('vs_1gpu_on', nan):>12.2f}x"
              + (f"  target {r['target_vs_1gpu']}x {'met' if r['met'] else 'NOT met'}" if "met" in r else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
