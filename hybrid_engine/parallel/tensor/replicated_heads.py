"""A projection of whole heads over more MP ranks than it has heads (a grouped-query attention's key/value heads
when kv_heads < mp): every rank holds the whole weight and uses the one head its query heads share, rank r the
head r x heads / mp, as vLLM and Megatron's GQA conversions do. The weight is replicated, so every rank's partial
gradient of the whole weight is summed over MP (`copy_to_mp_region` on the weight, then the rank's rows)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybrid_engine.parallel.tensor import ops

from .layers import _mark, _rank_and_size

__all__ = ["ReplicatedHeadsLinear"]


class ReplicatedHeadsLinear(nn.Module):
    """x [.., in] -> this rank's head [.., out / heads] of `linear` (a full weight [out, in] of `heads` whole
    heads, optional bias), which every rank of the group holds whole."""

    def __init__(self, linear: nn.Module, group: Optional[dist.ProcessGroup], heads: int):
        super().__init__()
        self.mp_group = group
        self.mp_rank, self.mp_size = _rank_and_size(group)
        if self.mp_size % heads:
            raise ValueError(f"{heads} heads cannot be shared by {self.mp_size} model-parallel ranks: mp must be a "
                             "multiple of them")
        self.heads, self.head = heads, self.mp_rank * heads // self.mp_size
        self.width = linear.weight.shape[0] // heads
        for name in ("weight", "bias"):
            full = getattr(linear, name, None)
            param = None if full is None else nn.Parameter(full.detach().clone(), requires_grad=full.requires_grad)
            _mark(param, False)
            self.register_parameter(name, param)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = slice(self.head * self.width, (self.head + 1) * self.width)
        weight, bias = (None if t is None else ops.copy_to_mp_region(t, self.mp_group)[rows]
                        for t in (self.weight, self.bias))
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"head {self.head} of {self.heads} (replicated), on rank {self.mp_rank} of {self.mp_size}"
