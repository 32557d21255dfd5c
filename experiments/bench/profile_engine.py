"""Profile a few engine steps with torch.profiler: where a step's time goes on each rank.

    torchrun --nproc_per_node=2 experiments/bench/profile_engine.py --pp 2 --amp fp16 --schedule zb1 --merge-wgrad

Takes the driver's model/grid flags; prints per rank the step time, the GPU-busy time (union of kernel
intervals) and the top CUDA kernels, and writes a Chrome trace per rank to --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from hybrid_engine.config.checks import resolve_grid  # noqa: E402
from hybrid_engine.engine.engine import Engine  # noqa: E402
from hybrid_engine.parallel.grid import build_groups  # noqa: E402
from hybrid_engine.models import SyntheticRegression, large_linear_model  # noqa: E402
from hybrid_engine.models import losses
from hybrid_engine.config.engine import PrecisionConfig, ScheduleConfig  # noqa: E402
from profile_driver import busy_us  # noqa: E402  (this folder: the script's own)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dp", type=int, default=None)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--mp", type=int, default=1)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--merge-wgrad", action="store_true")
    p.add_argument("--lookahead", type=int, default=0)
    p.add_argument("--amp", default="off")
    p.add_argument("--amp-impl", default="half-weights")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = p.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    grid = resolve_grid(a.dp, a.pp, a.mp, "mp-dp-pp", world)
    groups = build_groups(grid, rank)
    engine = Engine(large_linear_model(a.dim, a.depth, 0), losses.MSE(), groups, device=device,
                    schedule=ScheduleConfig(a.schedule, a.micro_batches, lookahead=a.lookahead,
                                            merge_weight_grads=a.merge_wgrad),
                    precision=PrecisionConfig(a.amp, a.amp_impl))
    data = SyntheticRegression(a.dim, 0, device)
    per = a.batch_size // grid.dp_size
    d = groups.coords.dp

    def step(i):
        x, y = data.batch(i, a.batch_size)
        return engine.train_step(x[d * per:(d + 1) * per], y[d * per:(d + 1) * per])

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(3 + i)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.steps
    events = prof.events()
    busy = busy_us(events) / a.steps / 1e3
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60)
    prof.export_chrome_trace(os.path.join(a.out, f"profile_rank{rank}.json"))
    for r in range(world):
        if r == rank:
            print(f"rank {rank}: step {wall * 1e3:.2f} ms, GPU busy {busy:.2f} ms ({busy / (wall * 1e3):.0%})")
            print(table, flush=True)
        dist.barrier()
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
