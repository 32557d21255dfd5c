#!/usr/bin/env python3
"""The transformer-step pass's logs (experiments/passes/transformer_step_pass.sh) -> one results file and a table.

    python experiments/analysis/transformer_step_results.py LOG_DIR OUT.json --card NAME --torch VERSION

The GPU tests: their exit status and pytest's last summary line (a test run cut by its time limit says so). The
head's bench: its JSON record. The runs (l4_*): as grids_results.py reads them, each run's --metrics file, the median
after the warm-up. Ratios as kernels_results.py takes them (tokens/s, peak memory, last loss), each against the eager
bf16 run of the same job: graphed (l4_bf16_graphs) and fp8 (l4_fp8, l4_fp8_rowwise; issue 38's target: fp8 >= 1.3x
bf16 tokens/s); with an earlier tree's runs (l4_*_old), this tree's over them (new_over_old).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grids_results import collect
from kernels_results import ratios

RATIOS = {"l4_bf16_graphs": ("l4_bf16", None), "l4_fp8": ("l4_bf16", 1.3), "l4_fp8_rowwise": ("l4_bf16", 1.3),
          "l4_fp8_old": ("l4_bf16_old", 1.3)}
AB = {"l4_bf16": ("l4_bf16_old", None), "l4_fp8": ("l4_fp8_old", None)}  # with OLD: this tree over the earlier one


def tests_of(res: Path) -> dict | None:
    """The GPU tests' outcome: passed (exit 0), timed out (exit 124, pytest's progress dots so far) or failed."""
    rc_file, log = res / "gpu_tests.rc", res / "gpu_tests.log"
    if not rc_file.exists():
        return None
    rc = int(rc_file.read_text())
    lines = [line for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    summary = next((line for line in reversed(lines) if " passed" in line or " failed" in line), None)
    outcome = "passed" if rc == 0 else "timed out" if rc == 124 else "failed"
    dots = lines[0].count(".") if lines and set(lines[0].split()[0]) <= set(".sFx") else 0
    return {"command": (res / "gpu_tests.cmd").read_text().strip(), "rc": rc, "outcome": outcome,
            "summary": summary, "tests_passed_before_the_limit": dots if rc == 124 else None}


def bench_of(res: Path) -> dict | None:
    log = res / "head_bench.log"
    records = [line for line in log.read_text().splitlines() if line.startswith("{")] if log.exists() else []
    return json.loads(records[-1]) if records else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", required=True)
    p.add_argument("--torch", required=True)
    a = p.parse_args()
    runs = {name: run for name, run in collect(a.log_dir).items() if name.startswith("l4_")}
    for run in runs.values():
        run.pop("gpus", None)  # one GPU each: the command's CUDA_VISIBLE_DEVICES
    result = {"card": a.card, "torch": a.torch, "gpu_tests": tests_of(a.log_dir), "head_bench": bench_of(a.log_dir),
              "runs": runs, "ratios": ratios(runs, RATIOS)}
    if ab := ratios(runs, AB):
        result["new_over_old"] = ab
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"GPU tests: {result['gpu_tests']}")
    print(f"head bench: {result['head_bench']}")
    for name, r in runs.items():
        print(f"{name:<16} " + (f"{r['step_ms']:9.2f} ms {r['per_s']:10.1f} tokens/s MFU {r['mfu']:.3f}"
                                if "per_s" in r else r.get("error", "")[:100]))
    for name, r in result.get("new_over_old", {}).items():
        print(f"{name} / {r['vs']} (this tree over the earlier one): {r['tokens_per_s_ratio']}x tokens/s")
    for name, r in result["ratios"].items():
        print(f"{name} / {r['vs']}: {r['tokens_per_s_ratio']}x tokens/s" +
              ("" if r["target"] is None else f" (target {r['target']}x: {'met' if r['met'] else 'missed'})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
