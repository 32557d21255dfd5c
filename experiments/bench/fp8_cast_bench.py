"""fp8's quantization kernels on one GPU, each as a share of the card's copy bandwidth: the absolute maxima (ATen's
infinity-norm reductions, tensor-wise and along each dimension) and fp8/gpu_cast.py's casts into both layouts at
every tile side and warp count asked, against a plain copy of the same tensor (`clone`: one read, one write) timed
the same way. An H200 profile of the 8B layer cut put the casts at about a third of the bandwidth; this says which
tile moves them closer.

    python experiments/bench/fp8_cast_bench.py                       # the 8B's x and dy shapes, the default tiles
    python experiments/bench/fp8_cast_bench.py --shapes 4096x14336 --blocks 64 128 --warps 4 8

One JSON line a shape: each variant's milliseconds (CUDA events, the median of the iterations) and GB/s (the bytes
it must move: a bf16 read, and one byte a value a layout written), and the copy's GB/s beside them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from hybrid_engine.fp8.quantize import E4M3, local_amax
from hybrid_engine.kernels.options import has_triton


def timed_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def measure(rows: int, cols: int, blocks: list[int], warps: list[int], iters: int, warmup: int) -> dict:
    from hybrid_engine.fp8 import gpu_cast

    t = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    n = t.numel()
    variants = {"copy (clone)": (lambda: t.clone(), 4 * n),
                "amax tensor-wise": (lambda: gpu_cast.amax(t, None), 2 * n),
                "amax along dim 1": (lambda: gpu_cast.amax(t, 1), 2 * n),
                "amax along dim 0": (lambda: gpu_cast.amax(t, 0), 2 * n)}
    tensor = local_amax(t, None)
    row, col = local_amax(t, 1), local_amax(t, 0)
    for block in blocks:
        for w in warps:
            variants[f"casts tensor-wise, both layouts, block {block}, {w} warps"] = (
                lambda b=block, w=w: gpu_cast.casts(t, tensor, tensor, E4M3, False, block=b, num_warps=w), 4 * n)
            variants[f"casts row-wise, both layouts, block {block}, {w} warps"] = (
                lambda b=block, w=w: gpu_cast.casts(t, row, col, E4M3, True, block=b, num_warps=w), 4 * n)
    out = {}
    for name, (fn, nbytes) in variants.items():
        ms = timed_ms(fn, iters, warmup)
        out[name] = {"ms": round(ms, 4), "gb_s": round(nbytes / ms / 1e6, 1)}
    return {"rows": rows, "cols": cols, "device": torch.cuda.get_device_name(), "variants": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["4096x4096", "4096x14336", "4096x1024"],
                        help="ROWSxCOLS of the bf16 operand (default: the 8B's x, its gate's dy, a kv dy at tp 2)")
    parser.add_argument("--blocks", nargs="+", type=int, default=[32, 64, 128], help="tile sides to time")
    parser.add_argument("--warps", nargs="+", type=int, default=[4, 8], help="warps a tile to time")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if not has_triton():
        print("fp8_cast_bench: needs a CUDA GPU with Triton (the kernels it times are Triton's)", file=sys.stderr)
        return 2
    for shape in args.shapes:
        rows, cols = (int(v) for v in shape.split("x"))
        result = measure(rows, cols, args.blocks, args.warps, args.iters, args.warmup)
        print(f"{rows} x {cols} on {result['device']}:")
        for name, v in result["variants"].items():
            print(f"  {v['ms']:8.4f} ms  {v['gb_s']:8.1f} GB/s  {name}")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
