"""The GPT under DTensor tensor parallelism, torchtitan's plan (torchtitan/models/llama3/parallelize.py) over all ranks.

    token embedding  RowwiseParallel: vocabulary split, output all-reduced (Replicate) or, with
                     sequence parallelism (SP), reduce-scattered along the sequence (Shard(1))
    qkv, up          ColwiseParallel: whole heads / MLP columns per rank (input all-gathered under SP)
    out, down        RowwiseParallel: output all-reduced, or reduce-scattered along the sequence under SP
    LayerNorms       SequenceParallel under SP (weights replicated, activations split along the sequence)
    head             ColwiseParallel with vocabulary-split logits kept as DTensors, into loss_parallel()
                     (the cross-entropy never gathers the logits)

What torchtitan's Llama has no counterpart for, the learned position embedding, stays a plain replicated
module; under SP its output is cut to this rank's part of the sequence (PrepareModuleOutput, no communication
forward; the backward all-gathers the position gradients). Gradients accumulate over the micro-batches (loss
divided by their count), under bf16 autocast over fp32 weights. AdamW: fused where torch has the fused kernel
for DTensors, else foreach -- tried once, on the first step, and said in the record. Parameters that stay plain
tensors (the non-SP LayerNorms, the positions) are their own parameter group: one fused call takes one kind.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)

import common  # first of ours: it puts the repository on sys.path
from hybrid_engine.models.gpt.model import GPTConfig, gpt_loss
from plain_gpt import PlainGPT, load_engine_init


def tp_plan(cfg: GPTConfig, sequence_parallel: bool) -> dict:
    """Module name -> parallel style, torchtitan's plan for this model (see the module docstring)."""
    seq = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout between the blocks
    plan = {"tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    if sequence_parallel:
        plan["positions"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
        plan["norm"] = SequenceParallel()
    for i in range(cfg.layers):
        plan.update({f"blocks.{i}.qkv": ColwiseParallel(input_layouts=seq),
                     f"blocks.{i}.out": RowwiseParallel(output_layouts=seq),
                     f"blocks.{i}.up": ColwiseParallel(input_layouts=seq),
                     f"blocks.{i}.down": RowwiseParallel(output_layouts=seq)})
        if sequence_parallel:
            plan.update({f"blocks.{i}.norm1": SequenceParallel(), f"blocks.{i}.norm2": SequenceParallel()})
    return plan


def build(a: argparse.Namespace, cfg: GPTConfig, device: torch.device, sequence_parallel: bool):
    """(step(inputs, targets) -> loss on every rank, the record's fields): the whole model split over all ranks."""
    tp = dist.get_world_size()
    if cfg.heads % tp or cfg.vocab_size % tp or cfg.seq_len % tp:
        common.fail(f"tensor parallel over {tp} ranks needs heads, vocabulary and sequence divisible by {tp}")
    mesh = init_device_mesh(device.type, (tp,))
    model = parallelize_module(load_engine_init(PlainGPT(cfg).to(device)), mesh, tp_plan(cfg, sequence_parallel))
    groups = [[p for p in model.parameters() if isinstance(p, DTensor) == kind] for kind in (True, False)]
    param_groups = [{"params": g} for g in groups if g]
    dtype = torch.bfloat16 if a.precision == "bf16" else None
    micro = a.micro_batches
    fields = {"system": "dtensor-tp-sp" if sequence_parallel else "dtensor-tp", "pp": 1, "tp": tp,
              "sequence_parallel": sequence_parallel, "plan": "torchtitan (Colwise/Rowwise, SequenceParallel "
              "norms under SP, vocabulary-parallel embedding and loss_parallel head)",
              "init": "the engine's initial weights", "optimizer": None}
    optimizer = None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal optimizer
        for p in model.parameters():
            p.grad = None
        total = torch.zeros((), device=device)
        for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits = model(xb)
            with loss_parallel():  # the backward too: the loss's gradient is vocabulary-split like its input
                loss = gpt_loss(logits, yb) / micro
                loss.backward()
            total += loss.detach().full_tensor() if isinstance(loss, DTensor) else loss.detach()
        if optimizer is None:
            optimizer, fields["optimizer"] = first_step_adamw(param_groups, a.lr)
        else:
            optimizer.step()
        return total  # the loss is replicated: every rank holds it

    return step, fields


def first_step_adamw(param_groups: list, lr: float) -> tuple[torch.optim.Optimizer, str]:
    """AdamW after its first step, and which kind it is: fused where torch runs the fused kernel on these
    (DTensor) parameters, else foreach. A fused step that fails changes no parameter; its optimizer (and state)
    is dropped and a foreach one takes the same gradients."""
    try:
        optimizer = torch.optim.AdamW(param_groups, lr=lr, weight_decay=0.01, fused=True)
        optimizer.step()
        return optimizer, "AdamW (fused)"
    except (RuntimeError, NotImplementedError) as err:
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
    optimizer = torch.optim.AdamW(param_groups, lr=lr, weight_decay=0.01, foreach=True)
    optimizer.step()
    return optimizer, f"AdamW (foreach: the fused step failed on these parameters: {reason})"
