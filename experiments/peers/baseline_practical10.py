#!/usr/bin/env python3
"""The Practical 10 base code ("hybrid DP + MP + pipeline concept"), rebuilt faithfully as the baseline.

What the course script does, and so does this one:
  * one process per DP rank (torchrun --nproc_per_node=N), each driving TWO GPUs: the first half of the
    model on device0 = cuda:local_rank, the second half on device1 = cuda:local_rank + N (the course hard-codes
    + 2 for its 4-GPU node; + N is the same mapping for any node with 2N GPUs);
  * the batch is cut into MICRO_BATCHES micro-batches that run stop-and-wait: forward through half 1,
    `.to(device1)`, forward through half 2, loss on device1, backward, and only then the next micro-batch
    (so one GPU always idles while the other works);
  * data parallelism by all_reduce of every parameter's gradient after the last micro-batch, then the step.

What is the same as the engine, so the numbers compare: the course MLP and data of hybrid_engine.models
(same seed -> same initial weights and batches), MSE per micro-batch divided by MICRO_BATCHES once, the
driver's flags. --amp fp16 is torch.autocast(float16) + torch.amp.GradScaler, bf16 autocast alone, off is
plain fp32 with TF32 disabled. The all-reduce is skipped with one DP rank (it would only copy).

    torchrun --nproc_per_node=1 experiments/peers/baseline_practical10.py --dim 8192 --depth 16 \\
        --batch-size 1024 --micro-batches 8 --amp fp16          # 2 GPUs
    torchrun --nproc_per_node=2 ... --device cpu                 # CPU + gloo, both halves on the CPU

Prints one JSON line from rank 0 (experiments/peers/common.py: record).
"""
from __future__ import annotations

import argparse
import sys

import common  # noqa: F401  (puts the repository on sys.path)
import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import (AMP_TO_PREC, add_common_args, autocast_dtype, build_layers, check_common_args, emit,
                    exact_fp32_matmuls, exit_without_teardown, fail, gather_peaks, init_distributed, make_optimizer, record, reset_peaks,
                    time_steps, use_cuda)
from hybrid_engine.models import SyntheticRegression


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    a = p.parse_args()
    cuda = use_cuda(a.device)
    exact_fp32_matmuls()
    rank, world, local_rank = init_distributed(cuda)
    check_common_args(a, world)
    BATCH_SIZE, MICRO_BATCHES = a.batch_size, a.micro_batches  # the course script's two knobs

    if cuda:
        nproc = world  # one node: torchrun's nproc_per_node
        if local_rank + nproc >= torch.cuda.device_count():
            fail(f"the base code drives 2 GPUs per process: needs {2 * nproc} visible GPUs for "
                             f"{nproc} processes, found {torch.cuda.device_count()}")
        device0 = torch.device("cuda", local_rank)
        device1 = torch.device("cuda", local_rank + nproc)
        torch.cuda.set_device(device0)
    else:
        device0 = device1 = torch.device("cpu")
    print(f"[Rank {rank}] part 1 on {device0}, part 2 on {device1}, {MICRO_BATCHES} micro-batches",
          file=sys.stderr, flush=True)

    modules = 2 * a.depth  # Linear, ReLU, Linear, ReLU, ...
    half = 2 * (a.depth // 2)
    part1 = build_layers(a.dim, a.depth, a.seed, range(0, half), device0)
    part2 = build_layers(a.dim, a.depth, a.seed, range(half, modules), device1)
    params = list(part1.parameters()) + list(part2.parameters())
    optimizer = make_optimizer(a.optimizer, params, a.lr)
    half_dtype = autocast_dtype(a.amp)
    scaler = torch.amp.GradScaler(device0.type, enabled=a.amp == "fp16")

    data = SyntheticRegression(a.dim, a.seed, device0)
    per_rank = BATCH_SIZE // world
    rows = slice(rank * per_rank, (rank + 1) * per_rank)

    def batch_of(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.batch(step, BATCH_SIZE)
        return x[rows], y[rows].to(device1)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device1)
        for xb, yb in zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES)):  # stop-and-wait
            with torch.autocast(device0.type, dtype=half_dtype or torch.float32, enabled=half_dtype is not None):
                h = part1(xb)
                h = h.to(device1)
                out = part2(h)
                loss = F.mse_loss(out.float(), yb) / MICRO_BATCHES
            scaler.scale(loss).backward()
            total += loss.detach()
        if world > 1:  # data parallelism: average the gradients of every parameter over the DP ranks
            for q in params:
                dist.all_reduce(q.grad)
                q.grad.div_(world)
            dist.all_reduce(total)
            total /= world
        scaler.step(optimizer)
        scaler.update()
        return float(total.item())

    reset_peaks([device0, device1])
    times, losses = time_steps(train_step, batch_of, a, [device0, device1])
    peaks = gather_peaks([device0, device1])
    if rank == 0:
        emit(record(system="base", mode="practical10", prec=AMP_TO_PREC[a.amp],
                    gpus=2 * world, dp=world, pp=2, mp=1, dim=a.dim, depth=a.depth,
                    batch=BATCH_SIZE, micro=MICRO_BATCHES, times=times, losses=losses, peaks=peaks))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
