#!/usr/bin/env python3
"""What a user would pick instead of our engine: PyTorch's own pipelining and tensor parallelism.

Modes (one process per GPU):
  gpipe, 1f1b    torch.distributed.pipelining ScheduleGPipe / Schedule1F1B, one stage per rank
  interleaved    ScheduleInterleaved1F1B, two stages per rank (stage s on rank s mod world)
  tp             DTensor tensor parallel over all ranks: Linear pairs ColwiseParallel then RowwiseParallel
                 (the Megatron split), micro-batches by gradient accumulation
  single         one GPU, the whole model, micro-batches by gradient accumulation (the 1-GPU baseline)

Same model, data, loss and optimizer as the engine (experiments/peers/common.py); the stages are cut with the
engine's partition (hybrid_engine.parallel.pipeline.partition). Precision as a user would write it: --amp off is fp32 with TF32
disabled; bf16 wraps every stage (or the model) in torch.autocast; fp16 adds torch.amp.GradScaler, whose
found-inf flags are all-reduced over the ranks before the step so that every stage skips or steps together
(as FSDP's ShardedGradScaler does). Stages pass half-precision activations between them (no cast back to fp32).
The pipelining schedules average gradients over micro-batches themselves (scale_grads), so the per-micro-batch
loss is the plain MSE there; in tp/single the loss is divided by the micro-batch count.

    torchrun --nproc_per_node=2 experiments/peers/peer_torch_pipelining.py --mode 1f1b --dim 8192 --depth 16 \\
        --batch-size 1024 --micro-batches 8 --amp fp16

Prints one JSON line from rank 0 (experiments/peers/common.py: record).
"""
from __future__ import annotations

import argparse
import inspect
import warnings

import common  # noqa: F401  (puts the repository on sys.path)
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from common import (AMP_TO_PREC, add_common_args, autocast_dtype, build_layers, check_common_args, emit,
                    exact_fp32_matmuls, exit_without_teardown, fail, gather_peaks, init_distributed, make_optimizer, record, reset_peaks,
                    time_steps, use_cuda)
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.parallel.pipeline.partition import partition

PIPELINE_MODES = ("gpipe", "1f1b", "interleaved")
MODES = PIPELINE_MODES + ("tp", "single")


class Autocast(nn.Module):
    """Runs a stage under torch.autocast: how a user gets mixed precision into a pipeline stage."""

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype | None):
        super().__init__()
        self.inner, self.device_type, self.dtype = inner, device_type, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            return self.inner(x)


def agree_on_overflow(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
    """After scaler.unscale_: make every rank's found-inf flag the OR over all ranks, so that stages (or TP
    shards) holding different gradients take the same skip-or-step decision and keep the same scale."""
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
    flags = state.get("found_inf_per_device") if isinstance(state, dict) else None
    if flags is None:
        warnings.warn("GradScaler internals changed: found-inf flags are not agreed across ranks")
        return
    for flag in flags.values():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)


def optimizer_step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
    if scaler.is_enabled():
        scaler.unscale_(optimizer)
        if dist.get_world_size() > 1:
            agree_on_overflow(scaler, optimizer)
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def build_pipeline(a, rank: int, world: int, device: torch.device, dtype, scaler):
    """(schedule, parameters, holds first stage, holds last stage) for the pipelining modes."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    num_stages = world * (2 if a.mode == "interleaved" else 1)
    if a.depth < num_stages:
        fail(f"--depth {a.depth} < {num_stages} stages")
    layout = partition(large_linear_model(a.dim, a.depth, a.seed), num_stages)
    mine = [rank + k * world for k in range(num_stages // world)]
    stages, params = [], []
    for s in mine:
        module = Autocast(build_layers(a.dim, a.depth, a.seed, layout[s], device), device.type, dtype)
        params += list(module.parameters())
        stages.append(PipelineStage(module, s, num_stages, device))

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return scaler.scale(F.mse_loss(output.float(), target))

    kwargs = {"loss_fn": loss_fn}
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[a.mode]
    if "scale_grads" in inspect.signature(schedule_cls.__init__).parameters:
        kwargs["scale_grads"] = True  # gradients averaged over micro-batches (the default; said explicitly)
    else:  # an old torch that sums: average through the loss instead (the kept losses are then divided too)
        kwargs["loss_fn"] = lambda out, tgt: loss_fn(out, tgt) / a.micro_batches
    schedule = schedule_cls(stages if a.mode == "interleaved" else stages[0], a.micro_batches, **kwargs)
    return schedule, params, 0 in mine, num_stages - 1 in mine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, required=True)
    add_common_args(p)
    a = p.parse_args()
    cuda = use_cuda(a.device)
    exact_fp32_matmuls()
    rank, world, local_rank = init_distributed(cuda)
    check_common_args(a, 1)
    if a.mode == "single" and world != 1:
        fail("--mode single runs on one process (torchrun --nproc_per_node=1)")
    if a.mode == "tp" and a.depth % 2:
        fail("--mode tp pairs Colwise and Rowwise layers: --depth must be even")
    if a.mode == "tp" and a.dim % world:
        fail(f"--mode tp: --dim {a.dim} is not divisible by {world} ranks")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = autocast_dtype(a.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=a.amp == "fp16")
    if scaler.is_enabled():  # the scale is created lazily by scale(): make it on every rank, not only the last
        scaler.scale(torch.ones((), device=device))
    data = SyntheticRegression(a.dim, a.seed, device)
    micro = a.micro_batches

    if a.mode in PIPELINE_MODES:
        schedule, params, first, last = build_pipeline(a, rank, world, device, dtype, scaler)
        step_kwargs = {}
        if "return_outputs" in inspect.signature(schedule.step).parameters:
            step_kwargs["return_outputs"] = False  # nobody needs the merged outputs: don't keep them

        def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
            optimizer.zero_grad(set_to_none=True)
            losses: list = []
            kwargs = dict(step_kwargs)
            if last:
                kwargs.update(target=y, losses=losses)
            schedule.step(*((x,) if first else ()), **kwargs)
            total = torch.zeros((), device=device)
            if last:  # the losses the schedule kept are the scaled ones
                total = torch.stack([t.detach().float() for t in losses]).mean() / scaler.get_scale()
            optimizer_step(scaler, optimizer)
            if world > 1:  # only the last stage's rank contributes
                dist.all_reduce(total)
            return float(total.item())
    else:
        model = build_layers(a.dim, a.depth, a.seed, range(2 * a.depth), device)
        if a.mode == "tp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh(device.type, (world,))
            plan = {str(2 * i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(a.depth)}
            model = parallelize_module(model, mesh, plan)
        params = list(model.parameters())

        def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
            optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=device)
            for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = F.mse_loss(model(xb).float(), yb) / micro
                scaler.scale(loss).backward()
                total += loss.detach()
            optimizer_step(scaler, optimizer)
            return float(total.item())  # tp: the output is replicated, so is the loss

    optimizer = make_optimizer(a.optimizer, params, a.lr)
    reset_peaks([device])
    times, losses = time_steps(train_step, lambda step: data.batch(step, a.batch_size), a, [device])
    peaks = gather_peaks([device])
    if rank == 0:
        pp = world if a.mode in PIPELINE_MODES else 1
        mp = world if a.mode == "tp" else 1
        emit(record(system="peer", mode=a.mode, prec=AMP_TO_PREC[a.amp], gpus=world, dp=1, pp=pp, mp=mp,
                    dim=a.dim, depth=a.depth, batch=a.batch_size, micro=micro, times=times, losses=losses,
                    peaks=peaks, stages_per_rank=2 if a.mode == "interleaved" else 1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
