"""One fp8 linear layer's forward and backward (hybrid_engine/fp8) beside bf16 `nn.Linear` at x [M, K], w [N, K],
timed on one GPU with CUDA events (median of the iterations), and the fp8 time split into its parts: each
operand's quantization (x and dy once a micro-batch in both layouts; w in both layouts once a step with the weight
cache, or its two forms every micro-batch without), the three fp8 GEMMs on operands quantized beforehand, and the
fp32 main-grad add the engine's gradient hook does with fp8's bf16 weight gradient (the bf16 layers accumulate in
their GEMM). The same quantization the engine runs: its Triton kernels where Triton is, torch._scaled_mm on a
card with fp8.

    python experiments/bench/fp8_linear_bench.py --m 4096 --k 4096 --n 14336                   # an 8B gate/up
    python experiments/bench/fp8_linear_bench.py --m 4096 --k 14336 --n 4096 --recipe rowwise  # an 8B down
    python experiments/bench/fp8_linear_bench.py --device cpu --m 64 --k 32 --n 48 --iters 2   # the emulated path

`--micro-batches`: how many forward+backward share one quantization of the weight (a step's). On the CPU the
times are wall-clock and say nothing of a GPU; that mode only runs the script's code.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from hybrid_engine.fp8.matmul import fp8_linear, operand_groups, scaled_product, weight_forms
from hybrid_engine.fp8.quantize import E4M3, E5M2, Quantizer
from hybrid_engine.fp8.weight_cache import Fp8WeightCache
from hybrid_engine.kernels.options import FP8_CAPABILITY, has_triton


def timed_ms(fn, device: torch.device, iters: int, warmup: int) -> float:
    """Median milliseconds of one fn() call: CUDA events around each call on a GPU, the wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize(device)
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events)


def measure(m: int, k: int, n: int, recipe: str, micro: int, device: torch.device, iters: int, warmup: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen).requires_grad_()
    dy = torch.randn(m, n, device=device, dtype=torch.bfloat16, generator=gen)
    linear = nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
    weight = linear.weight
    native = device.type == "cuda" and torch.cuda.get_device_capability(device) >= FP8_CAPABILITY
    gpu_kernels = device.type == "cuda" and has_triton()
    quantizer = Quantizer(gpu_kernels)
    rowwise, grad_dtype = recipe == "rowwise", E4M3 if recipe == "rowwise" else E5M2
    groups = operand_groups(None, None, rowwise)
    cache = Fp8WeightCache()

    def bf16_step():
        x.grad = weight.grad = None
        linear(x).backward(dy)

    def fp8_step(weights):
        x.grad = weight.grad = None
        fp8_linear(x, weight, recipe, native=native, quantize=quantizer, weights=weights).backward(dy)

    def fp8_cached_step():  # a step's micro-batches: the weight quantized at the first
        cache.clear()
        for _ in range(micro):
            fp8_step(cache)

    qx = quantizer.both(x.detach(), E4M3, rowwise)
    qdy = quantizer.both(dy, grad_dtype, rowwise)
    qw = weight_forms(weight.detach(), rowwise, groups, quantizer)
    dw = scaled_product(qdy.first, qdy.first_scale, qx.first, qx.first_scale, rowwise, native, torch.bfloat16)
    main_grad = torch.zeros(n, k, device=device, dtype=torch.float32)
    per_gemm = [(x.detach(), E4M3, 1), (weight.detach(), E4M3, 1), (dy, grad_dtype, 1), (weight.detach(), E4M3, 0),
                (dy, grad_dtype, 0), (x.detach(), E4M3, 0)]
    parts = {
        "quantize x (both layouts)": lambda: quantizer.both(x.detach(), E4M3, rowwise),
        "quantize dy (both layouts)": lambda: quantizer.both(dy, grad_dtype, rowwise),
        "quantize w (both layouts)": lambda: weight_forms(weight.detach(), rowwise, groups, quantizer),
        "quantize, each GEMM's operands from scratch (6)":
            lambda: [quantizer(t, d, rowwise, c) for t, d, c in per_gemm],
        "fp8 GEMM y = x w.T": lambda: scaled_product(*qx[:2], *qw[:2], rowwise, native, torch.bfloat16,
                                                     fast_accum=True),
        "fp8 GEMM dx = dy w": lambda: scaled_product(*qdy[:2], *qw[2:], rowwise, native, torch.bfloat16),
        "fp8 GEMM dw = dy.T x": lambda: scaled_product(*qdy[2:], *qx[2:], rowwise, native, torch.bfloat16),
        "main grad += dw (fp32 += bf16)": lambda: main_grad.add_(dw),
    }
    ms = {"bf16 nn.Linear forward+backward": timed_ms(bf16_step, device, iters, warmup),
          f"fp8 forward+backward, weight cached ({micro} micro-batches a step)":
              timed_ms(fp8_cached_step, device, iters, warmup) / micro,
          "fp8 forward+backward, no weight cache": timed_ms(lambda: fp8_step(None), device, iters, warmup)}
    ms |= {name: timed_ms(fn, device, iters, warmup) for name, fn in parts.items()}
    quantize = (ms["quantize x (both layouts)"] + ms["quantize dy (both layouts)"] +
                ms["quantize w (both layouts)"] / micro)
    gemms = sum(ms[name] for name in ms if name.startswith("fp8 GEMM"))
    flops = 3 * 2.0 * m * k * n
    return {"m": m, "k": k, "n": n, "recipe": recipe, "micro_batches": micro, "native": native,
            "gpu_kernels": gpu_kernels,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "ms": {name: round(v, 4) for name, v in ms.items()},
            "quantize_ms_per_micro_batch": round(quantize, 4), "fp8_gemms_ms": round(gemms, 4),
            "bf16_tflops": round(flops / ms["bf16 nn.Linear forward+backward"] / 1e9, 1),
            "fp8_gemm_tflops": round(flops / gemms / 1e9, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=4096, help="tokens of a micro-batch (rows of x)")
    parser.add_argument("--k", type=int, default=4096, help="input features")
    parser.add_argument("--n", type=int, default=14336, help="output features")
    parser.add_argument("--recipe", choices=("tensorwise", "rowwise", "both"), default="both")
    parser.add_argument("--micro-batches", type=int, default=8, help="micro-batches that share a weight quantization")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="calls before timing (compiles the regions)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here (--device cpu runs the emulated path)")
    for recipe in (("tensorwise", "rowwise") if args.recipe == "both" else (args.recipe,)):
        result = measure(args.m, args.k, args.n, recipe, args.micro_batches, device, args.iters, args.warmup)
        print(f"{recipe} M {args.m} K {args.k} N {args.n} on {result['device']} "
              f"({'torch._scaled_mm' if result['native'] else 'emulated'}):")
        for name, value in result["ms"].items():
            print(f"  {value:9.3f} ms  {name}")
        print(f"  {result['quantize_ms_per_micro_batch']:9.3f} ms  quantization a micro-batch (x, dy, w / "
              f"{args.micro_batches}) against {result['fp8_gemms_ms']:.3f} ms of fp8 GEMMs")
        print(json.dumps(result))


if __name__ == "__main__":
    main()
