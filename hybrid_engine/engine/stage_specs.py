"""What travels between pipeline stages: every stage's input and output shape and dtype, found before the first
step by running each stage once (the executor pre-allocates its receive buffers from them)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

import hybrid_engine._C as _C

from hybrid_engine.config.engine import PrecisionConfig
from hybrid_engine.parallel.grid import GridGroups


def probe_stage_specs(stages: dict[int, nn.Sequential], groups: GridGroups, num_stages: int, placement: str,
                      precision: PrecisionConfig, device: torch.device,
                      micro_input: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every stage's input and output as meta tensors, the same on every rank of the pipeline. Stage by stage,
    the owner runs its stage once on zeros (no grad) and tells the whole pipeline what came out.
    stages: this rank's {stage: module}; placement: the schedule's; micro_input: a micro-batch of the first stage
    (None elsewhere)."""
    pp_size, pp_rank, pp_group = groups.grid.pp_size, groups.coords.pp, groups.pp
    specs: list[tuple[tuple[int, ...], torch.dtype] | None] = [None] * (num_stages + 1)
    box = [(tuple(micro_input.shape), micro_input.dtype) if micro_input is not None else None]
    if pp_size > 1:
        first = _C.schedule.stage_rank(0, pp_size, num_stages, placement)
        dist.broadcast_object_list(box, src=groups.pp_ranks[first], group=pp_group)
    specs[0] = box[0]
    for s in range(num_stages):
        owner = _C.schedule.stage_rank(s, pp_size, num_stages, placement)
        box = [None]
        if owner == pp_rank:
            shape, dtype = specs[s]
            with torch.no_grad(), torch.autocast(device.type, dtype=precision.half_dtype,
                                                 enabled=precision.autocast):
                out = stages[s](torch.zeros(shape, dtype=dtype, device=device))
            box = [(tuple(out.shape), out.dtype)]
        if pp_size > 1:
            dist.broadcast_object_list(box, src=groups.pp_ranks[owner], group=pp_group)
        specs[s + 1] = box[0]
    meta = [torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in specs]
    return meta[:-1], meta[1:]
