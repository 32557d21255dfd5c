"""What the comparison programs share, so that every system trains exactly the same thing.

The engine driver (hybrid_engine.py), the Practical-10 base code (baseline_practical10.py) and the torch peer
(peer_torch_pipelining.py) all train the course MLP of hybrid_engine.models on SyntheticRegression data with
the same seed, the same per-micro-batch MSE divided by the micro-batch count once, and the same optimizer.
The two comparison programs share the flags (and their meaning) of the driver and print one JSON record
(see `record`) from rank 0 on stdout; everything else goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `python experiments/peers/x.py` puts experiments/peers/ first, not the repository
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from hybrid_engine.models import large_linear_model, materialize  # noqa: E402

AMP_TO_PREC = {"off": "fp32", "fp16": "fp16", "bf16": "bf16"}
LOSSES_REPORTED = 5


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The driver's flags, with the driver's defaults and meaning (--steps counts the warm-up steps too)."""
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all DP replicas together)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per DP rank per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10, help="steps, warm-up included (as the driver counts them)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--amp", choices=tuple(AMP_TO_PREC), default="off",
                   help="off: fp32 matrix products (TF32 off); fp16: autocast + GradScaler; bf16: autocast")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")


def fail(message: str) -> None:
    """One line on stderr, '<program>: error: ...' like argparse, and exit status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def check_common_args(a: argparse.Namespace, dp: int) -> None:
    if a.steps <= a.warmup:
        fail(f"--steps {a.steps} must exceed --warmup {a.warmup} (nothing would be timed)")
    if a.batch_size % (dp * a.micro_batches) != 0:
        fail(f"--batch-size {a.batch_size} is not divisible by dp x micro-batches = {dp} x {a.micro_batches}")


def use_cuda(choice: str) -> bool:
    if choice == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but no CUDA GPU is visible")
    return choice == "cuda" or (choice == "auto" and torch.cuda.is_available())


def exact_fp32_matmuls() -> None:
    """fp32 means fp32: no TF32 in matrix products or convolutions (the engine side runs the same way)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def autocast_dtype(amp: str) -> torch.dtype | None:
    return {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[amp]


def init_distributed(cuda: bool) -> tuple[int, int, int]:
    """(rank, world, local_rank) under torchrun, or a one-rank group for a plain `python x.py`."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def build_layers(dim: int, depth: int, seed: int, modules: Sequence[int], device: torch.device) -> nn.Sequential:
    """The course model's modules with these indices (of its nn.Sequential), materialized on `device` with
    the same per-layer seeded initial weights the engine draws (hybrid_engine.models)."""
    whole = large_linear_model(dim, depth, seed)  # meta: costs nothing
    return materialize(nn.Sequential(*[whole[i] for i in modules]), device)


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr) if name == "sgd" else torch.optim.Adam(params, lr=lr)


def synchronize(devices: Sequence[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def reset_peaks(devices: Sequence[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)


def peak_gib(devices: Sequence[torch.device]) -> list[float]:
    """Peak allocated memory of each of this process's GPUs; on the CPU the process's peak RSS (once)."""
    cuda = [d for d in dict.fromkeys(devices) if d.type == "cuda"]
    if cuda:
        return [torch.cuda.max_memory_allocated(d) / 2**30 for d in cuda]
    return [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20]


def gather_peaks(devices: Sequence[torch.device]) -> list[float]:
    """Every process's per-GPU peaks, in rank order, flattened (one entry per GPU used)."""
    mine = [round(x, 3) for x in peak_gib(devices)]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return [x for per_rank in everyone for x in per_rank]


def time_steps(step_fn: Callable[[torch.Tensor, torch.Tensor], float],
               batch_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]], a,
               devices: Sequence[torch.device]) -> tuple[list[float], list[float]]:
    """Run a.steps steps; returns (seconds of each step after the warm-up, loss of every step).

    As in the engine driver, the batch of a step (batch_of(step): this rank's inputs and targets, already
    where the program wants them) is drawn before the clock starts; a step ends when its global loss is known
    on every rank and every GPU of this process is idle."""
    times, losses = [], []
    for step in range(a.steps):
        x, y = batch_of(step)
        synchronize(devices)
        if dist.get_world_size() > 1:
            dist.barrier()
        start = time.perf_counter()
        loss = step_fn(x, y)
        synchronize(devices)
        elapsed = time.perf_counter() - start
        losses.append(loss)
        if step >= a.warmup:
            times.append(elapsed)
        print(f"step {step:3d}  loss {loss:.6f}  {elapsed * 1e3:9.2f} ms", file=sys.stderr, flush=True)
    return times, losses


def model_flops(batch: int, dim: int, depth: int) -> float:
    """Matrix-product FLOPs of one training step: 2 forward + 4 backward per multiply-add (biases ignored)."""
    return 6.0 * batch * dim * dim * depth


def record(*, system: str, mode: str, prec: str, gpus: int, dp: int, pp: int, mp: int, dim: int, depth: int,
           batch: int, micro: int, times: Sequence[float], losses: Sequence[float], peaks: Sequence[float],
           **extra) -> dict:
    """The one-line result every benchmark program prints (bench.py builds the engine's from its metrics)."""
    med = statistics.median(times)
    out = {"system": system, "mode": mode, "prec": prec, "gpus": gpus, "dp": dp, "pp": pp, "mp": mp,
           "dim": dim, "depth": depth, "batch": batch, "micro": micro, "step_ms": round(med * 1e3, 3),
           "samples_s": round(batch / med, 1),
           "tflops_per_gpu": float(f"{model_flops(batch, dim, depth) / med / gpus / 1e12:.5g}"),
           "peak_gib": [round(float(x), 3) for x in peaks],
           "losses": [float(f"{x:.7g}") for x in list(losses)[:LOSSES_REPORTED]],
           "timed_steps": len(times)}
    out.update(extra)
    return out


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def exit_without_teardown(code: int) -> None:
    """Leave once the record is out and the process group is destroyed, skipping interpreter teardown: torch
    objects destroyed there (DTensor/pipelining state, gloo/NCCL work) abort now and then with "terminate
    called without an active exception", seen in CI for the peer's tp mode and the base code's dp=2 run,
    turning a finished measurement into a failed run."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
