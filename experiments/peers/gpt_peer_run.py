"""What every GPT peer program shares: the flags, the engine's data, the timed loop and the one JSON line.

Data: the engine's own draw. `TokenDataset.batch(t, batch)` (hybrid_engine/data/datasets.py) is row i of step t at
hash(seed, t, i), whatever the grid, and the engine cuts it into micro-batches with `chunk`; the peers read the
same file with the same seed and cut the same way, so step t trains the same sequences everywhere. All steps'
batches are drawn before the first step (a few MB), outside the timing, as the engine draws outside its step.

Timing: each step ends with the loss on every rank (an all-reduce, which also lines the ranks up) and a device
synchronisation; the step time is the median after the warm-up steps, as in the engine's summary. Peak memory is
torch.cuda.max_memory_allocated of every rank. MFU is model FLOPs (hybrid_engine.metrics.flops: 6 N + 12 L h s per
token) per GPU over the card's datasheet dense peak. The record is printed by the last rank, which holds the loss.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable

import common  # also puts the repository on sys.path
import torch
import torch.distributed as dist

from hybrid_engine.parallel.pipeline.balance import balanced_partition
from hybrid_engine.data import open_dataset
from hybrid_engine.metrics.flops import mfu
from hybrid_engine.models.gpt.flops import gpt_flops_per_token
from hybrid_engine.models.gpt.model import GPTConfig, layer_costs

PRECISIONS = {"bf16": torch.bfloat16, "fp32": None}


def add_args(p: argparse.ArgumentParser) -> None:
    """The engine driver's GPT flags under the same names, with the GPT-1B pass's values as defaults."""
    p.add_argument("--data", required=True, help="token file (hybrid_engine.data); its vocabulary is the model's")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="steps, warm-up included")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0, help="data draw and (for torch peers) the engine's initial weights")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16",
                   help="bf16: autocast over fp32 weights (Megatron: its own bf16); fp32: no autocast, no TF32")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for the tests")


def check_args(a: argparse.Namespace) -> None:
    if a.steps <= a.warmup:
        common.fail(f"--steps {a.steps} must exceed --warmup {a.warmup} (nothing would be timed)")
    if a.batch_size % a.micro_batches:
        common.fail(f"--batch-size {a.batch_size} is not divisible by --micro-batches {a.micro_batches}")


def init_distributed(a: argparse.Namespace) -> torch.device:
    """One process per GPU (NCCL), or gloo ranks on the CPU; fp32 means fp32 (no TF32)."""
    common.exact_fp32_matmuls()
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def model_config(a: argparse.Namespace) -> tuple[GPTConfig, list]:
    """(the GPT's shape, vocabulary from the data file; every step's whole batch as (inputs, targets) on CPU)."""
    data = open_dataset(a.data, a.seq_len, a.seed)
    cfg = GPTConfig(vocab_size=data.vocab_size, layers=a.layers, hidden=a.hidden, heads=a.heads,
                    seq_len=a.seq_len, seed=a.seed)
    return cfg, [data.batch(step, a.batch_size) for step in range(a.steps)]


def engine_cut(cfg: GPTConfig, stages: int) -> list[list[int]]:
    """The engine's pipeline cut (hybrid_engine.parallel.pipeline.balance over models.gpt.layer_costs): module indices of each stage,
    0 the embeddings, 1..L the blocks, L+1 the head. At the GPT-1B shape: 0..9 | 10..17 (9 blocks, then 7 and the
    head, whose 32000-word GEMM costs about a block); the pipeline peers cut the same way."""
    return balanced_partition(layer_costs(cfg), stages)


def run_steps(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], batches: list, device: torch.device,
              warmup: int) -> tuple[list[float], list[float]]:
    """(step times after the warm-up, every step's loss): step(inputs, targets) returns the loss on every rank."""
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for i, (x, y) in enumerate(batches):
        _synchronize(device)
        start = time.perf_counter()
        loss = float(step(x, y))
        _synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss)
    return times, losses


def emit(a: argparse.Namespace, cfg: GPTConfig, device: torch.device, times: list[float], losses: list[float],
         **fields) -> None:
    """The run's JSON line, from the last rank (collective: every rank's peak memory is gathered)."""
    world = dist.get_world_size()
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0],
                        device=device)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if dist.get_rank() != world - 1:
        return
    step_s = statistics.median(times)
    tokens_s = a.batch_size * a.seq_len / step_s
    flops = gpt_flops_per_token(cfg)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(json.dumps({**fields, "device": name, "gpus": world, "precision": a.precision, "hidden": cfg.hidden,
                      "layers": cfg.layers, "heads": cfg.heads, "seq": cfg.seq_len, "vocab": cfg.vocab_size,
                      "batch": a.batch_size, "micro": a.micro_batches, "step_ms": round(step_s * 1e3, 2),
                      "tokens_s": round(tokens_s), "tflops_per_gpu": round(tokens_s * flops / world / 1e12, 1),
                      "mfu": mfu(tokens_s / world, flops, name, a.precision),
                      "peak_gib": [round(float(p), 2) for p in peaks], "losses": losses,
                      "timed_steps": len(times), "data": f"{a.data} (the engine's draw of (seed {a.seed}, step))"}),
          flush=True)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
