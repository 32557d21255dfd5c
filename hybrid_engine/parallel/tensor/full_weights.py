"""Full weights into a layer whose parameters may be split over MP: each parameter keeps its rank's slice of the
full tensor of its name (`take_shard`: the vocabulary padded with zero rows where the parameter says so), a
replicated one the whole tensor. A layer's initial weights are always drawn full (models/init.py), so they
depend on the seed alone, never on the grid."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .layers import take_shard

__all__ = ["mp_group_of", "load_full"]


def mp_group_of(layer: nn.Module) -> Optional[dist.ProcessGroup]:
    """The MP group a layer was split over: the one its parallel sub-modules hold (None: not split)."""
    return next((m.mp_group for m in layer.modules() if getattr(m, "mp_group", None) is not None), None)


@torch.no_grad()
def load_full(layer: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Copy `full` (full tensors by parameter name, every parameter of `layer` among them) into the layer, each
    parameter keeping its rank's slice."""
    group = mp_group_of(layer)
    for name, param in layer.named_parameters():
        param.copy_(take_shard(full[name], param, group))
