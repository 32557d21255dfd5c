"""The step's loss as every rank reports it: the mean over the global batch."""
from __future__ import annotations

import torch
import torch.distributed as dist


def global_mean_loss(micro_losses: list[torch.Tensor], contributes: bool, replicas: int,
                     device: torch.device) -> float:
    """Mean loss over the global batch, on every rank: one small all-reduce over the world in which only the last
    stage's MP rank 0 of each replica contributes (`contributes`: this rank does) its micro-batches' mean. The
    replicas -- dp x cp ranks, each holding its rows' or its chunks' equal share of the tokens -- average once."""
    value = (torch.stack(micro_losses).mean() if (contributes and micro_losses)
             else torch.zeros((), device=device))
    value = value.detach().to(torch.float64 if device.type == "cpu" else torch.float32).reshape(1)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
    return float(value.item()) / replicas
