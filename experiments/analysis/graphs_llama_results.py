#!/usr/bin/env python3
"""The Llama graphs pass's logs (experiments/passes/graphs_llama_pass.sh) -> one results file and a table.

    python experiments/analysis/graphs_llama_results.py LOG_DIR OUT.json --card NAME --torch VERSION --shape FLAGS

Runs are <grid>_off and <grid>_on (grid: gpu1, tp4, pp4, pp2tp2; graph_tests, where the pass ran them: pytest's
summary line), read as grids_results.py reads them (each run's
--metrics file, the median after the warm-up), each with the CUDA-graphs line its log printed (what the engine
replayed, or why not). Ratios: each grid's graphs on against off, and each 4-GPU run against 4 x one GPU with the
same --cuda-graphs (issue 38's target for tp4: at least 0.8), each with the relative difference of the last losses.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grids_results import collect

GRIDS = {"gpu1": 1, "tp4": 4, "pp4": 4, "pp2tp2": 4}
TARGET_OF_4X = {"tp4": 0.8}  # tokens/s of 4 GPUs against 4 x one GPU


def graphs_line(log: Path) -> str | None:
    """The engine's CUDA-graphs line (rank 0 prints it once), None where the log has none."""
    if not log.exists():
        return None
    return next((line.strip() for line in log.read_text().splitlines() if line.startswith("CUDA graphs ")), None)


def loss_diff(r: dict, b: dict) -> float | None:
    if r.get("last_loss") is None or not b.get("last_loss"):
        return None
    return round(abs(r["last_loss"] - b["last_loss"]) / abs(b["last_loss"]), 5)


def ratios(runs: dict) -> dict:
    out = {}
    for grid, gpus in GRIDS.items():
        off, on = runs.get(f"{grid}_off", {}), runs.get(f"{grid}_on", {})
        row = {}
        if "per_s" in on and "per_s" in off:
            row.update(on_vs_off=round(on["per_s"] / off["per_s"], 3), last_loss_rel_diff=loss_diff(on, off))
        for mode, r in (("off", off), ("on", on)):
            one = runs.get(f"gpu1_{mode}", {})
            if gpus > 1 and "per_s" in r and "per_s" in one:
                value = round(r["per_s"] / (gpus * one["per_s"]), 3)
                row[f"{mode}_vs_{gpus}x_1gpu"] = value
                if grid in TARGET_OF_4X:
                    row[f"{mode}_target_met"] = value >= TARGET_OF_4X[grid]
        if row:
            out[grid] = row
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--shape", required=True)
    a = p.parse_args()
    runs = collect(a.log_dir)
    runs.pop("graph_tests", None)  # WITH_TESTS=1: pytest's summary line, kept apart
    tests_log = a.log_dir / "graph_tests.log"
    tests_lines = tests_log.read_text().strip().splitlines() if tests_log.exists() else []
    tests = tests_lines[-1] if tests_lines else None
    for name, run in runs.items():
        run.pop("gpus", None)  # the command says: --nproc_per_node
        run["graphs_line"] = graphs_line(a.log_dir / f"{name}.log")
    result = {"card": a.card, "torch": a.torch, "unit": "tokens/s", "shape": a.shape, "graph_tests": tests,
              "runs": runs, "ratios": ratios(runs)}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'run':<14} {'step ms':>9} {'tokens/s':>10} {'peak GiB':>9} {'loss':>8}  graphs")
    for name, r in runs.items():
        if "per_s" not in r:
            print(f"{name:<14} {r.get('error', '')[:80]}")
            continue
        peak = max(r["peak_gib"]) if r.get("peak_gib") else float("nan")
        print(f"{name:<14} {r['step_ms']:>9.1f} {r['per_s']:>10.1f} {peak:>9.2f} {r['last_loss']:>8.4f}  "
              f"{r['graphs_line'] or '?'}")
    for grid, row in result["ratios"].items():
        print(f"{grid}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
