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


def cast_transposed(t: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype):
    """cast(t) transposed and made contiguous in the same pass (a 2-D t whose contracted dimension is its first),
    the scale transposed with it."""
    q, scale = cast(t, amax, dtype)
    return q.t().contiguous(), scale.reshape(-1, 1) if scale.dim() else scale


class Quantizer:
    """quantize(t, dtype, rowwise, contracted, group) -> (q, scale): a 2-D operand of a GEMM in `dtype`, made
    contiguous with its contracted dimension (`contracted`: 0 or 1 of t) last, and its dequantizing scale in fp32
    (q.float() * scale ~ t, or its transpose): one scale for the tensor, or (rowwise) one a row along the
    contracted dimension, [rows, 1]. The absolute maxima are all-reduced (MAX) over `group` when given (the
    dimension they run over is split there), then the saturating cast writes q, transposing it in the same pass
    where the contracted dimension comes first. `compiled`: the maximum and the casts are torch.compile'd regions
    (kernels/options.py), the all-reduce between them."""

    def __init__(self, compiled: bool = False):
        self._amax = region(local_amax, compiled)
        self._cast, self._cast_transposed = region(cast, compiled), region(cast_transposed, compiled)

    def __call__(self, t: torch.Tensor, dtype: torch.dtype, rowwise: bool, contracted: int,
                 group: Optional[dist.ProcessGroup] = None):
        t = t.detach()
        a = self._amax(t, contracted if rowwise else None)
        if group is not None and group.size() > 1:
            dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
        return self._cast(t, a, dtype) if contracted == 1 else self._cast_transposed(t, a, dtype)


quantize = Quantizer()  # eager, stateless: what the emulation and the tests call


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale
