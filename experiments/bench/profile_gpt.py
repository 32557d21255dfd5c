"""Profile a few steps of the driver's own configuration with torch.profiler: where a GPT step's time goes.

    torchrun --nproc_per_node=1 experiments/bench/profile_gpt.py --model gpt --hidden 2048 --layers 16 --heads 16 \\
        --seq-len 2048 --data TOKENS --batch-size 16 --micro-batches 8 --amp bf16 --optimizer adamw

Takes the driver's flags (hybrid_engine.config.flags), builds the same workload and engine, runs --steps steps (the
first half warm-up, the second half profiled) and prints per rank the step time, the GPU-busy share and the top
CUDA kernels by total time; a Chrome trace per rank goes to $OUT.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from hybrid_engine.models import registry  # noqa: E402
from hybrid_engine.train.cli import parse_config  # noqa: E402
from hybrid_engine.parallel.grid import build_groups  # noqa: E402
from hybrid_engine.train.trainer import build_engine  # noqa: E402
from profile_engine import busy_us  # noqa: E402


def main() -> None:
    cfg = parse_config(sys.argv[1:], "profile_gpt.py")
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    grid = cfg.validate(world, "cuda", registry.check_model)
    groups = build_groups(grid, rank)
    workload = registry.build_workload(cfg, device)
    engine = build_engine(cfg, workload, groups, device)
    per_dp = cfg.data.batch_size // grid.dp_size
    first = groups.coords.dp * per_dp
    dtype = engine.precision.half_dtype if engine.precision.half_weights else torch.float32

    def step(i: int) -> float:
        x, y = workload.draw(i, first, first + per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage, dtype=dtype, device=device)
        return engine.train_step(x, y).step_time_s

    steps = cfg.training.steps
    for i in range(steps // 2):
        step(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        times = [step(i) for i in range(steps // 2, steps)]
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.events()
    print(f"rank {rank}: median step {sorted(times)[len(times) // 2] * 1e3:.1f} ms; GPU busy "
          f"{busy_us(events) / 1e3 / len(times):.1f} ms per step of {wall / len(times) * 1e3:.1f} ms", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=32, max_name_column_width=70), flush=True)
    prof.export_chrome_trace(os.path.join(os.environ.get("OUT", "/tmp"), f"profile_gpt_rank{rank}.json"))
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
