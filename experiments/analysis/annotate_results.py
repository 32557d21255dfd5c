#!/usr/bin/env python3
"""Recompute the derived fields of results files in place (bench_analysis.annotate: mfu against the datasheet
peak, gemm_fraction against the measured GEMM rate, the bubbles), e.g. after a definition changed:

    python experiments/analysis/annotate_results.py experiments/results/2026-11-26-2xH200.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # analysis/ reads bench/, never the reverse
from bench_analysis import DEFINITIONS, annotate  # noqa: E402


def main(paths: list[str]) -> int:
    for path in paths:
        data = json.loads(Path(path).read_text())
        meta = data.get("meta", {})
        annotate(data.get("runs", []), meta.get("gemm_peak_tflops", {}), meta.get("card_full", ""))
        meta["definitions"] = {**meta.get("definitions", {}), **DEFINITIONS}
        Path(path).write_text(json.dumps(data, indent=1) + "\n")
        print(f"{path}: {sum('mfu' in r for r in data.get('runs', []))} runs annotated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
