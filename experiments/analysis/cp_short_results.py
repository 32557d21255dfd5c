#!/usr/bin/env python3
"""The short context-parallel pass's logs (experiments/passes/cp_short_pass.sh) -> one results JSON.

    python experiments/analysis/cp_short_results.py LOG_DIR OUT.json --card NAME

Per variant (ring, all-gather): the step times of its --metrics file after the warm-up (median, min, max) and its
tokens/s at the median; then, per rank, what its profile of steps 6-10 says a step holds (profile_driver.py's
"steps"): the device time of the compute kernels, of the NCCL kernels (which run, and wait for their peers, on their
own streams), the GPU-busy union and the kernels launched. A kernel is an entry with device time and no host time
of its own; the profiler's annotations (nccl:*, ProfilerStep*) and memory copies and sets are left out.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SEQ = 16384
NOT_KERNELS = ("ProfilerStep", "nccl:", "Memset", "Memcpy", "Command Buffer", "Activity Buffer", "Buffer Flush")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernelExC")


def steps(path: Path, warmup: int = 5) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{") and "step_time_s" in line]
    times = [row["step_time_s"] * 1e3 for row in rows][warmup:]
    median = statistics.median(times)
    return {"steps_timed": len(times), "step_ms": round(median, 1), "min_ms": round(min(times), 1),
            "max_ms": round(max(times), 1), "tokens_s": round(SEQ / median * 1e3),
            "predicted_ms": round(rows[-1]["predicted_step_time_s"] * 1e3, 1)}


def profile(path: Path) -> dict:
    data = json.loads(path.read_text())
    n, ops = data["steps"], data["ops"]
    kernels = {k: v for k, v in ops.items() if v[1] > 0 and v[2] == 0 and not k.startswith(NOT_KERNELS)}
    nccl = sum(v[1] for k, v in kernels.items() if "nccl" in k.lower())
    compute = sum(v[1] for k, v in kernels.items() if "nccl" not in k.lower())
    return {"compute_kernels_ms": round(compute / 1e3 / n, 1), "nccl_kernels_ms": round(nccl / 1e3 / n, 1),
            "gpu_busy_ms": round(data["gpu_busy_us"] / 1e3 / n, 1),
            "launches": round(sum(ops.get(k, [0])[0] for k in LAUNCHES) / n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--card", required=True)
    args = parser.parse_args()
    out = {"card": args.card, "seq": SEQ, "cp": 4, "variants": {}}
    for variant, short in (("ring", "ring"), ("all-gather", "all")):
        entry = steps(args.logs / f"cp4_16k_{short}.jsonl")
        entry["per_rank_profile"] = [profile(p) for p in sorted(args.logs.glob(f"profile_16k_{short}-rank*.json"))]
        out["variants"][variant] = entry
    ring, gather = out["variants"]["ring"], out["variants"]["all-gather"]
    out["all_gather_over_ring"] = round(gather["tokens_s"] / ring["tokens_s"], 3)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
