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

from hybrid_engine.kernels.options import region

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero operand: scale 1/floor, its quantization exactly zero


def local_amax(t: torch.Tensor, dim: Optional[int]) -> torch.Tensor:
    """|t|'s maximum in fp32, over the whole tensor (dim None: a 0-d tensor) or along `dim` (kept)."""
    return (t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)).float()


def cast(t: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype):
    """(t in `dtype`, its dequantizing scale): scale = amax / the dtype's largest value, the cast saturating."""
    top = torch.finfo(dtype).max
    scale = amax.clamp(min=AMAX_FLOOR) / top
    return (t.float() / scale).clamp(-top, top).to(dtype), scale


class Quantizer:
    """quantize(t, dtype, dim, group) -> (t in `dtype`, its dequantizing scale in fp32), t ~ q.float() * scale:
    the absolute maximum over the tensor (dim None) or along `dim`, all-reduced (MAX) over `group` when given
    (the dimension it runs over is split there), then the saturating cast. `compiled`: the maximum and the cast
    each one torch.compile'd region (kernels/options.py), the all-reduce between them."""

    def __init__(self, compiled: bool = False):
        self._amax, self._cast = region(local_amax, compiled), region(cast, compiled)

    def __call__(self, t: torch.Tensor, dtype: torch.dtype, dim: Optional[int],
                 group: Optional[dist.ProcessGroup] = None):
        a = self._amax(t, dim)
        if group is not None and group.size() > 1:
            dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
        return self._cast(t, a, dtype)


quantize = Quantizer()  # eager, stateless: what the emulation and the tests call


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale
