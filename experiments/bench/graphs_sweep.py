#!/usr/bin/env python3
"""The course MLP's step with its native stages CUDA-graphed and eager (--cuda-graphs on | off), every grid of this
job's world size in one process per rank (one torchrun, no start-up per run):

    torchrun --nproc_per_node=4 experiments/bench/graphs_sweep.py --out sweep4.json   # dp4, pp4, mp4, pp2xmp2, ...
    torchrun --nproc_per_node=1 experiments/bench/graphs_sweep.py --out sweep1.json   # one GPU, 1, 4 and 8 micro-b.

Each run is what the driver's step is (Engine.train_step on the MLP's synthetic data, fp16 half weights, SGD):
configs L (dim 8192, depth 16, batch 1024) and C (dim 8192, depth 8, batch 64) as in the grids pass, with 1F1B
where the grids pass ran ZB-H1 (zero-bubble's W actions are not graphed): m micro-batches of a grid with a pipeline,
one otherwise. The median step after --warmup steps (the graphs are captured in the second step), the last loss
(equal off and on) and the peak memory go to --out as JSON, rank 0's. --device cpu --tiny: the same sweep on gloo
ranks at toy sizes, graphs replayed by the host (the pass's SMOKE mode)."""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hybrid_engine import ProcessGrid, build_groups  # noqa: E402
from hybrid_engine.config.engine import PrecisionConfig, ScheduleConfig, StageConfig  # noqa: E402
from hybrid_engine.engine.engine import Engine  # noqa: E402
from hybrid_engine.models import SyntheticRegression, large_linear_model, losses  # noqa: E402
from hybrid_engine.optim import optimizers as optim  # noqa: E402
from hybrid_engine.parallel.pipeline.graphs import GraphChoice, graphed  # noqa: E402

CONFIGS = {"L": (8192, 16, 1024), "C": (8192, 8, 64)}
TINY = {"L": (64, 8, 32), "C": (64, 4, 8)}
# (dp, pp, mp, micro-batches): the grids pass's, 1F1B for its ZB-H1 pipelines
GRIDS = {4: [(4, 1, 1, 1), (1, 4, 1, 8), (1, 1, 4, 1), (1, 2, 2, 4), (2, 2, 1, 4), (2, 1, 2, 1)],
         1: [(1, 1, 1, 1), (1, 1, 1, 4), (1, 1, 1, 8)]}


def run(groups, grid: tuple, config: str, mode: str, args) -> dict:
    dp, pp, mp, m = grid
    dim, depth, batch = (TINY if args.tiny else CONFIGS)[config]
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    stages = StageConfig(cuda_graphs="off" if mode == "host" else mode)
    engine = Engine(large_linear_model(dim, depth, 0), losses.MSE(), groups, optimizer=optim.SGD(1e-3),
                    schedule=ScheduleConfig("1f1b", m), stages=stages,
                    precision=PrecisionConfig("fp16" if args.device == "cuda" else "off"), device=device)
    if mode == "host":
        engine._programs = graphed(engine._programs, GraphChoice(True, "host replay"), str(device), host_rerun=True)
    data = SyntheticRegression(dim, 0, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, loss = [], None
    for step in range(args.steps):
        x, y = data.batch(step, batch // dp)
        result = engine.train_step(x, y)
        times.append(result.step_time_s)
        loss = result.loss
    graphed_now = any(hasattr(p, "captures") for p in engine.stage_programs.values())
    engine.close()
    del engine
    gc.collect()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"grid": f"dp{dp} pp{pp} mp{mp}", "config": config, "micro_batches": m,
            "graphs": "off" if mode == "off" else "on", "host_replay": mode == "host",
            "graphed": graphed_now, "median_step_ms": 1e3 * statistics.median(times[args.warmup:]),
            "steps_ms": [round(1e3 * t, 3) for t in times], "last_loss": loss, "peak_gib": peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--configs", default="C,L")
    args = parser.parse_args()
    if args.device == "cuda":
        local = int(__import__("os").environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    on = "on" if args.device == "cuda" else "host"
    results = []
    for grid in GRIDS[world]:
        groups = build_groups(ProcessGrid(*grid[:3]), rank)
        for config in args.configs.split(","):
            for mode in ("off", on):
                start = time.perf_counter()
                try:
                    record = run(groups, grid, config, mode, args)
                    said = f"median step {record['median_step_ms']:.2f} ms, last loss {record['last_loss']:.6f}"
                except Exception as exc:  # noqa: BLE001 - a failed run is recorded (every rank fails it alike)
                    record = {"grid": f"dp{grid[0]} pp{grid[1]} mp{grid[2]}", "config": config,
                              "micro_batches": grid[3], "graphs": "off" if mode == "off" else "on",
                              "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                    said = f"FAILED {record['error']}"
                record["wall_s"] = round(time.perf_counter() - start, 1)
                results.append(record)
                if rank == 0:
                    print(f"{record['grid']} m{grid[3]} {config} graphs {mode}: {said}", flush=True)
                    Path(args.out).write_text(json.dumps(results, indent=1))  # what finished, if the job is cut
        groups.destroy()
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
