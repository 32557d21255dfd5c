#!/usr/bin/env python3
"""The card's own ceilings, measured the way the benchmarks run: one JSON line on stdout.

  gemm_peak_tflops      {fp32, fp16, bf16}: median TFLOP/s of an N x N x N matrix product (N = 8192 on GPUs),
                        fp32 with TF32 off (the benchmarks' fp32 is full fp32 too); the denominator of MFU
  gemm_tflops_by_rows   the same dtypes at M = 128, 1024, 2048 rows against an N x N weight: the shapes of
                        the benchmark's micro-batches (128-row products cannot reach the peak)
  hbm_copy_gbps         device-to-device copy of 1 GiB, counting bytes read plus bytes written
  p2p_copy_gbps         GPU 0 -> GPU 1 copy of 1 GiB (with two or more GPUs)

bench.py runs this in its own process so that the parent never holds a CUDA context. `--device cpu` (tiny
sizes) exists to test the plumbing.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def short_card_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; anything else -> the name without spaces or punctuation."""
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", name)
    return match.group(1) if match else re.sub(r"[^A-Za-z0-9]+", "-", name.replace("NVIDIA", "")).strip("-")


def _timed(fn, devices: tuple[torch.device, ...], repeats: int, inner: int) -> float:
    """Median seconds of one fn() call over `repeats` windows of `inner` back-to-back calls."""
    def sync():
        for d in devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    for _ in range(3):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def gemm_tflops(m: int, n: int, dtype: torch.dtype, device: torch.device) -> float:
    a = torch.randn(m, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    flops = 2.0 * m * n * n
    inner = max(1, min(50, int(2e13 / flops)))  # ~20-100 ms windows on a GPU
    seconds = _timed(lambda: torch.mm(a, b, out=out), (device,), repeats=5, inner=inner)
    return round(flops / seconds / 1e12, 2)


def copy_gbps(src: torch.device, dst: torch.device, nbytes: int) -> float:
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=src)
    y = torch.empty(nbytes // 4, dtype=torch.float32, device=dst)
    seconds = _timed(lambda: y.copy_(x), (src, dst), repeats=5, inner=5)
    both = 2 if src == dst else 1  # a copy within one memory reads and writes every byte
    return round(both * nbytes / seconds / 1e9, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cpu"), default="auto")
    p.add_argument("--size", type=int, default=None, help="N of the peak GEMM (default 8192 on GPUs, 256 on CPU)")
    p.add_argument("--info-only", action="store_true", help="card, count and memory only: no measurement")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    cuda = a.device == "auto" and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    n = a.size or (8192 if cuda else 256)
    out: dict = {
        "card_full": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "gemm_size": n,
    }
    out["card"] = short_card_name(out["card_full"]) if cuda else "cpu"
    if cuda:
        out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2)
    if a.info_only:
        print(json.dumps(out), flush=True)
        return 0
    out["gemm_peak_tflops"] = {k: gemm_tflops(n, n, dt, device) for k, dt in DTYPES.items()}
    rows = (128, 1024, 2048) if cuda else (16, 64)
    out["gemm_tflops_by_rows"] = {f"{k}_M{m}": gemm_tflops(m, n, dt, device) for k, dt in DTYPES.items() for m in rows}
    nbytes = 2**30 if cuda else 2**24
    out["hbm_copy_gbps"] = copy_gbps(device, device, nbytes)
    if cuda and torch.cuda.device_count() >= 2:
        out["p2p_copy_gbps"] = copy_gbps(torch.device("cuda", 0), torch.device("cuda", 1), nbytes)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
