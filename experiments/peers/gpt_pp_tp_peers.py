#!/usr/bin/env python3
"""The GPT's peers on a pipeline or tensor-parallel grid: what a user would run instead of the engine, one JSON line
per run.

    torchrun --nproc_per_node=2 experiments/peers/gpt_pp_tp_peers.py --mode MODE --data TOKENS [--hidden 2048 ...]

Modes (all ranks form one pipeline or one tensor-parallel group):
  torch-pp, torch-pp-compile  torch.distributed.pipelining (torch_pp_peer.py), per-block compile; --pp-schedule
                              1f1b (Schedule1F1B, the default), interleaved, zbv or dualpipev
  dtensor-tp, dtensor-tp-sp   DTensor tensor parallel, torchtitan's plan, with SequenceParallel (dtensor_tp_peer.py)
  megatron-pp, megatron-tp, megatron-tp-sp, megatron-pp-tp
                              Megatron-core's GPTModel, local spec, its pipeline schedule / TP / SP over all ranks, or
                              tp 2 x pp (ranks / 2) (megatron_gpt.py; CUDA only, its wheel on PYTHONPATH)
  single                      one process, the plain GPT with gradient accumulation: the reference of the tests

The torch modes and `single` train the engine's initial weights on the engine's draw of every step
(gpt_peer_run.py, plain_gpt.py), so their per-step losses compare with the engine's; Megatron draws its own
initial weights (same data), so its losses compare with the others only in size.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import common  # first of ours: it puts the repository on sys.path
import gpt_peer_run
import torch_pp_peer
from hybrid_engine.models.gpt.model import gpt_loss
from plain_gpt import PlainGPT, load_engine_init

MODES = ("torch-pp", "torch-pp-compile", "dtensor-tp", "dtensor-tp-sp", "megatron-pp", "megatron-tp",
         "megatron-tp-sp", "megatron-pp-tp", "single")


def build_single(a: argparse.Namespace, cfg, device: torch.device):
    """The whole plain GPT in one process: micro-batches by gradient accumulation (loss / count)."""
    if dist.get_world_size() != 1:
        common.fail("--mode single runs on one process (torchrun --nproc_per_node=1)")
    model = load_engine_init(PlainGPT(cfg).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, fused=True)
    dtype = torch.bfloat16 if a.precision == "bf16" else None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for xb, yb in zip(x.chunk(a.micro_batches), y.chunk(a.micro_batches)):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = gpt_loss(model(xb), yb) / a.micro_batches
            loss.backward()
            total += loss.detach()
        optimizer.step()
        return total

    return step, {"system": "torch", "pp": 1, "tp": 1, "optimizer": "AdamW (fused)",
                  "init": "the engine's initial weights"}


def build(a: argparse.Namespace, cfg, device: torch.device):
    if a.mode == "single":
        return build_single(a, cfg, device)
    if dist.get_world_size() < 2:
        common.fail(f"--mode {a.mode} needs at least 2 ranks (torchrun --nproc_per_node=2)")
    if a.mode.startswith("torch-pp"):
        return torch_pp_peer.build(a, cfg, device, compile_blocks=a.mode == "torch-pp-compile",
                                   schedule_name=a.pp_schedule)
    if a.mode.startswith("dtensor-tp"):
        import dtensor_tp_peer
        return dtensor_tp_peer.build(a, cfg, device, sequence_parallel=a.mode == "dtensor-tp-sp")
    if device.type != "cuda":
        common.fail(f"--mode {a.mode}: Megatron-core runs on CUDA only")
    import megatron_gpt  # only here: the CPU modes never import megatron
    world = dist.get_world_size()
    pp, tp = {"megatron-pp": (world, 1), "megatron-pp-tp": (world // 2, 2)}.get(a.mode, (1, world))
    return megatron_gpt.build_step(a, cfg, device, pp=pp, tp=tp, sequence_parallel=a.mode == "megatron-tp-sp")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--pp-schedule", choices=torch_pp_peer.SCHEDULES, default="1f1b",
                   help="torch-pp modes: torch pipelining's schedule (torch_pp_peer.py)")
    gpt_peer_run.add_args(p)
    a = p.parse_args()
    gpt_peer_run.check_args(a)
    device = gpt_peer_run.init_distributed(a)
    torch.manual_seed(a.seed)
    cfg, batches = gpt_peer_run.model_config(a)
    step, fields = build(a, cfg, device)
    times, losses = gpt_peer_run.run_steps(step, batches, device, a.warmup)
    gpt_peer_run.emit(a, cfg, device, times, losses, mode=a.mode, **fields)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The record is printed and the process group destroyed: skip the interpreter's teardown. DTensor's device
    # mesh still holds the gloo backend, whose threads would be torn down with the interpreter; a CPU rank of the
    # sequence-parallel mode aborted once in CI (SIGABRT, "terminate called without an active exception", not
    # reproduced in 12 local runs), and a joinable thread destroyed at exit is what prints that line.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
