#!/usr/bin/env python3
"""A profile archive of experiments/bench/profile_driver.py runs (a .tgz of <run>-rank<r>.json files) -> each run's
device time by category, in one results file.

    python experiments/analysis/profile_categories.py RAW.tgz OUT.json

Categories, by kernel name (the first that matches): the LM head's GEMMs (cuBLAS's bf16 kernels of the tile shapes
the 128k-vocabulary head takes: HEAD_GEMMS), the other GEMMs (fp8's `q` kernels among them), fp8's casts
(fp8/gpu_cast.py's kernel or the compiled regions' `clamp_div` and transposing `clone_t`), the absolute maxima
(ATen's AbsMax reductions or the regions' `abs_amax`), the fp32 += half main-grad additions, attention, the
optimizer, and the rest. Host-side rows (aten:: operators, the profiler's own) are not device time and are left out.
"""
from __future__ import annotations

import argparse
import json
import re
import tarfile
from pathlib import Path

# The bf16 cuBLAS tiles the 8B-shape runs' head GEMMs took on H200 (its [128256, 4096] weight: forward, input
# gradient, weight gradient); the blocks' bf16 GEMMs at these shapes took other tiles.
HEAD_GEMMS = ("nvjet_sm90_tss_128x256_64x4_2x1_v_badd", "nvjet_sm90_tst_192x176_64x4_2x1_v_bz")
CATEGORIES = [
    ("head_gemm", lambda k: k.startswith(HEAD_GEMMS)),
    ("gemm", lambda k: "nvjet" in k or "gemm" in k.lower() or "cutlass" in k),
    ("fp8_cast", lambda k: "_cast_kernel" in k or "clamp_div" in k or "clone_t" in k),
    ("fp8_amax", lambda k: "AbsMax" in k or "abs_amax" in k),
    ("main_grad_add", lambda k: "CUDAFunctor_add<float>" in k or "add_half" in k),
    ("attention", lambda k: "sdpa" in k or "flash" in k),
    ("optimizer", lambda k: "FusedOptimizer" in k or "multi_tensor" in k),
]
HOST = re.compile(r"^(aten::|Optimizer\.|cuda[A-Z]|Command Buffer Full|Lazy Function Loading|ProfilerStep)")


def categorize(ops: dict) -> dict:
    """{category: device ms} of one rank's {name: [calls, device µs, host µs]}."""
    out = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
    for name, (_, device_us, _) in ops.items():
        if HOST.match(name):
            continue
        category = next((c for c, test in CATEGORIES if test(name)), "other")
        out[category] += device_us / 1e3
    return {k: round(v, 1) for k, v in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive", type=Path)
    p.add_argument("out", type=Path)
    a = p.parse_args()
    runs = {}
    with tarfile.open(a.archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if member.isfile() and member.name.endswith(".json"):
                profile = json.load(tar.extractfile(member))
                run = Path(member.name).stem
                runs[run] = {"wall_s": round(profile["wall_s"], 2),
                             "gpu_busy_ms": round(profile["gpu_busy_us"] / 1e3, 1),
                             "device_ms": categorize(profile["ops"])}
    a.out.write_text(json.dumps({"archive": a.archive.name, "runs": runs}, indent=1) + "\n")
    for run, r in runs.items():
        print(f"{run}: busy {r['gpu_busy_ms']} ms; " + ", ".join(f"{k} {v}" for k, v in r["device_ms"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
