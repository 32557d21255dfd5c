"""What the CUDA-graph GPU tests share: one torchrun job that trains every grid of a table graphed and eager (a
runs script's `train`: tests/graph_runs.py for the MLP, tests/decoder_graph_runs.py for the transformers), and
that script's entry point for one rank under torchrun."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def run_graph_job(script: str, grids: dict[str, dict], gpus: int, out: Path, port: int,
                  timeout: int) -> dict[str, list[tuple[dict, dict]]]:
    """{grid: [(graphed, eager) per rank]}: every grid of `grids` with graphs on, then off, in one torchrun job of
    `gpus` processes running tests/<script>, each rank's results pickled to <out>.rank<r>."""
    runs = [dict(grid, graphs=graphs) for grid in grids.values() for graphs in ("on", "off")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}",
                            f"--master_port={port}", str(REPO / "tests" / script), str(out), json.dumps(runs)],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        _, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # the whole job (torchrun and its ranks), then the ranks' last lines
        os.killpg(job.pid, signal.SIGKILL)
        _, stderr = job.communicate()
        raise AssertionError(f"the graph job ran past {timeout} s; its last lines:\n{stderr[-4000:]}") from None
    assert job.returncode == 0, stderr[-4000:]
    ranks = []
    for rank in range(gpus):
        with open(f"{out}.rank{rank}", "rb") as f:
            ranks.append(pickle.load(f))
    return {name: [(r[2 * i], r[2 * i + 1]) for r in ranks] for i, name in enumerate(grids)}


def train_each(train_one: Callable[[int, dict, str], dict], rank: int, runs: list[dict], device: str) -> list[dict]:
    """train_one(rank, run, device) of every run, in order, each said on stderr as it starts and ends, so a job cut
    by its time limit shows where it stopped (run_graph_job prints the ranks' last lines)."""
    out = []
    for run in runs:
        print(f"rank {rank}: {json.dumps(run)} starts", file=sys.stderr, flush=True)
        started = time.perf_counter()
        out.append(train_one(rank, run, device))
        print(f"rank {rank}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return out


def torchrun_rank(train: Callable[..., list]) -> None:
    """One rank of a GPU job under torchrun (argv: OUT RUNS_JSON): NCCL on this rank's GPU, `train(rank, world,
    runs, device=...)`'s results pickled to OUT.rank<r>."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    results = train(rank, world, json.loads(sys.argv[2]), device=f"cuda:{os.environ['LOCAL_RANK']}")
    with open(f"{sys.argv[1]}.rank{rank}", "wb") as f:
        pickle.dump(results, f)
    dist.destroy_process_group()
