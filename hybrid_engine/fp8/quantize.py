"""Dynamic float8 scaling: an operand's absolute maximum, over the whole tensor (tensor-wise) or along the GEMM's
contracted dimension (row-wise: one scale a row of the left operand, one a column of the right), gives the scale
that maps it onto the float8 range; the cast saturates.

Under tensor parallelism a scale must be the full logical tensor's, so every grid quantizes alike: where the
dimension an absolute maximum runs over is split over MP, the maxima are all-reduced (MAX) over the MP group.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero operand: scale 1/floor, its quantization exactly zero


def amax(t: torch.Tensor, dim: Optional[int], group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """|t|'s maximum in fp32, over the whole tensor (dim None: a 0-d tensor) or along `dim` (kept); all-reduced
    (MAX) over `group` when given (the dimension it runs over is split there)."""
    a = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    a = a.float()
    if group is not None and group.size() > 1:
        dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
    return a


def quantize(t: torch.Tensor, dtype: torch.dtype, dim: Optional[int], group: Optional[dist.ProcessGroup] = None):
    """(t in `dtype`, its dequantizing scale in fp32): t ~ q.float() * scale, scale = amax / the dtype's largest
    value, amax over the tensor (dim None) or along `dim`, all-reduced over `group` (see amax)."""
    top = torch.finfo(dtype).max
    scale = amax(t, dim, group).clamp(min=AMAX_FLOOR) / top
    q = (t.float() / scale).clamp(-top, top).to(dtype)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale
