#!/usr/bin/env python3
"""Train your own nn.Sequential with hybrid_engine's public API (CPU + gloo works; GPUs use NCCL).

    torchrun --nproc_per_node=4 examples/custom_model.py          # dp=1, pp=2, mp=2 on 4 CPU processes

The model, the loss and the optimizer are ordinary PyTorch: the Engine cuts the model into pipeline stages, splits
its nn.Linear layers over the MP group (column- then row-parallel pairs), averages gradients over DP, and builds
the optimizer from a factory over the tensors it steps. Any module works for PP x DP (here GELU and LayerNorm:
those stages run through autograd, and rank 0 says so at start-up); tensor parallelism applies to nn.Linear
layers with elementwise modules between them.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from hybrid_engine import Engine, ProcessGrid, ScheduleConfig, build_groups


def huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.smooth_l1_loss(output, target)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pp, mp = (2, 2) if world % 4 == 0 else (world, 1)
    grid = ProcessGrid(world // (pp * mp), pp, mp)
    groups = build_groups(grid, rank)

    torch.manual_seed(0)  # the same initial model on every rank: the engine keeps each rank's part of it
    model = nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32),
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8),
    )
    engine = Engine(model, huber, groups, optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3),
                    schedule=ScheduleConfig("1f1b", micro_batches=4))

    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, 8, generator=gen)
    dp_rank, dp = groups.coords.dp, grid.dp_size
    for step in range(20):
        x = torch.randn(64, 32, generator=gen)
        y = torch.tanh(x @ teacher)
        rows = slice(dp_rank * 64 // dp, (dp_rank + 1) * 64 // dp)
        result = engine.train_step(x[rows], y[rows])
        if rank == 0 and step % 5 == 4:
            print(f"step {step}: loss {result.loss:.4f}", flush=True)
    engine.close()
    groups.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
