"""The GPT over a pipeline of torch.distributed.pipelining: one PipelineStage per rank, Schedule1F1B.

The cut is the engine's own (gpt_peer_run.engine_cut: at the GPT-1B shape the embeddings and 9 blocks, then 7
blocks and the head), so both pipelines balance the same stages. Each stage is a slice of the plain GPT
(plain_gpt.py) with the engine's initial weights, under bf16 autocast over fp32 weights; the last stage's output
goes to the engine's loss (mean cross-entropy in fp32) and the schedule averages the gradients over the
micro-batches itself (scale_grads). compile_blocks compiles each block in place (torchtitan's per-block
torch.compile), not the embeddings or the head. AdamW fused, as the engine steps on CUDA.
"""
from __future__ import annotations

import argparse
import inspect

import torch
import torch.distributed as dist

from gpt_peer_run import engine_cut
from hybrid_engine.models.gpt.model import GPTConfig, gpt_loss
from peer_torch_pipelining import Autocast
from plain_gpt import PlainGPT, load_engine_init


def build(a: argparse.Namespace, cfg: GPTConfig, device: torch.device, compile_blocks: bool):
    """(step(inputs, targets) -> loss on every rank, the record's fields) for this rank's stage."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, stages = dist.get_rank(), dist.get_world_size()
    layers = engine_cut(cfg, stages)[rank]
    first, last = rank == 0, rank == stages - 1
    block_ids = [i - 1 for i in layers if 1 <= i <= cfg.layers]
    blocks = range(block_ids[0], block_ids[-1] + 1) if block_ids else range(0)
    module = load_engine_init(PlainGPT(cfg, blocks, embed=first, head=last).to(device))
    if compile_blocks:
        for block in module.blocks:
            block.compile()
    dtype = torch.bfloat16 if a.precision == "bf16" else None
    stage = PipelineStage(Autocast(module, device.type, dtype), rank, stages, device)
    schedule = Schedule1F1B(stage, a.micro_batches, loss_fn=gpt_loss, scale_grads=True)
    optimizer = torch.optim.AdamW(module.parameters(), lr=a.lr, weight_decay=0.01, fused=True)
    # nobody needs the merged logits of every micro-batch (2 GB at the GPT-1B shape): don't keep them
    step_kwargs = {"return_outputs": False} if "return_outputs" in inspect.signature(schedule.step).parameters else {}

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        losses: list = []
        if first:
            schedule.step(x, **step_kwargs)
        elif last:
            schedule.step(target=y, losses=losses, **step_kwargs)
        else:
            schedule.step(**step_kwargs)
        optimizer.step()
        loss = torch.stack([t.detach().float() for t in losses]).mean() if last else torch.zeros((), device=device)
        dist.all_reduce(loss)  # only the last stage's rank adds its loss
        return loss

    cut = [f"{lay[0]}..{lay[-1]}" for lay in engine_cut(cfg, stages)]
    return step, {"system": "torch-pp-compile" if compile_blocks else "torch-pp", "pp": stages, "tp": 1,
                  "schedule": "Schedule1F1B", "stage_modules": cut, "compile": "each block" if compile_blocks else None,
                  "optimizer": "AdamW (fused)", "init": "the engine's initial weights"}
