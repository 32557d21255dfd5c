#!/usr/bin/env python3
"""Merge bench results files of one card into one, later files winning run by run.

    python experiments/analysis/merge_results.py OUT.json FIRST.json LATER.json ...

A later file's successful run replaces the earlier run with the same (system, mode, variant, config, prec,
dp, pp, mp); skipped or failed runs never replace a measured one. Each run keeps the name of the file it came
from ("source"); meta (GEMM peak, copy rates) is the first file's.

Every target ratio compares runs of one job: it is computed within each file, and the merged file takes it from
the newest file that measured it (ratio_details names that file). Mixing runs of different jobs (a later pass
that re-timed the 1-GPU run but not the dp=2 run, say) would compare machines, not systems.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # analysis/ reads bench/, never the reverse
from bench_analysis import compute_ratios, ok  # noqa: E402

KEY = ("system", "mode", "variant", "config", "prec", "dp", "pp", "mp")


def merge(paths: list[Path]) -> dict:
    files = {path.name: json.loads(path.read_text()) for path in paths}
    merged: dict[tuple, dict] = {}
    order: list[tuple] = []
    meta: dict = {}
    for name, data in files.items():
        # the first file's meta (its GEMM peak belongs to the runs it measured, X among them) stays
        meta = meta or dict(data["meta"])
        for run in data["runs"]:
            key = tuple(run.get(k, "") for k in KEY)
            run = {**run, "source": name}
            if key not in merged:
                order.append(key)
                merged[key] = run
            elif ok(run) or not ok(merged[key]):
                merged[key] = run
    runs = [merged[k] for k in order]
    meta["merged_from"] = list(files)
    ratios, details = newest_same_job_ratios({name: data["runs"] for name, data in files.items()}, meta)
    return {"meta": meta, "runs": runs, "ratios": ratios, "ratio_details": details}


def newest_same_job_ratios(runs_by_file: dict[str, list[dict]], meta: dict) -> tuple[dict, dict]:
    """Each target's ratio from the newest file (last in order) whose own runs give it (None where none does)."""
    ratios: dict = {}
    details: dict = {}
    for name, file_runs in runs_by_file.items():
        file_ratios, file_details = compute_ratios(file_runs, meta)
        for target, value in file_ratios.items():
            if value is not None or target not in ratios:
                ratios[target] = value
                details[target] = {**file_details[target], "source": name} if value is not None else file_details[target]
    return ratios, details


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    result = merge([Path(p) for p in sys.argv[2:]])
    out.write_text(json.dumps(result, indent=1))
    for name, value in result["ratios"].items():
        print(f"{name:50s} {value}")
