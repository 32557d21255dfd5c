"""Dynamic float8 scaling: an operand's absolute maximum, over the whole tensor (tensor-wise) or along the GEMM's
contracted dimension (row-wise: one scale a row of the left operand, one a column of the right), gives the scale
that maps it onto the float8 range; the cast saturates.

Under tensor parallelism a scale must be the full logical tensor's, so every grid quantizes alike: where the
dimension an absolute maximum runs over is split over MP, the maxima are all-reduced (MAX) over the MP group.

A tensor that two GEMMs read with different contracted dimensions (x in the forward and in dw, dy in dx and in dw,
w in the forward and in dx) is quantized in both layouts at once (`Quantizer.both`): it is read once, and a
tensor-wise scale, the same for both, is reduced once. Where no all-reduce sits between the maximum and the casts
the two run as one compiled region; under tensor parallelism the all-reduce splits them.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

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


def cast_both_tensorwise(t: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype):
    """cast(t) and cast_transposed(t) of one tensor-wise maximum: the second is the first's transpose."""
    q, scale = cast(t, amax, dtype)
    return q, scale, q.t().contiguous(), scale


def cast_both_rowwise(t: torch.Tensor, amax_last: torch.Tensor, amax_first: torch.Tensor, dtype: torch.dtype):
    """cast(t) along dimension 1 and cast_transposed(t) along dimension 0, reading t once."""
    return (*cast(t, amax_last, dtype), *cast_transposed(t, amax_first, dtype))


def both_tensorwise(t: torch.Tensor, dtype: torch.dtype):
    """The maximum and both layouts' casts of an operand no all-reduce splits: one compiled region."""
    return cast_both_tensorwise(t, local_amax(t, None), dtype)


def both_rowwise(t: torch.Tensor, dtype: torch.dtype):
    """Both maxima (along dimension 1 and 0) and both layouts' casts: one compiled region."""
    return cast_both_rowwise(t, local_amax(t, 1), local_amax(t, 0), dtype)


class Forms(NamedTuple):
    """A 2-D operand in fp8 in both layouts: `last` contracted along its dimension 1 (t's own layout), `first`
    along its dimension 0 (t transposed), each with its dequantizing scale."""

    last: torch.Tensor
    last_scale: torch.Tensor
    first: torch.Tensor
    first_scale: torch.Tensor


def _splits(group: Optional[dist.ProcessGroup]) -> bool:
    return group is not None and group.size() > 1


class Quantizer:
    """quantize(t, dtype, rowwise, contracted, group) -> (q, scale): a 2-D operand of a GEMM in `dtype`, made
    contiguous with its contracted dimension (`contracted`: 0 or 1 of t) last, and its dequantizing scale in fp32
    (q.float() * scale ~ t, or its transpose): one scale for the tensor, or (rowwise) one a row along the
    contracted dimension, [rows, 1]. The absolute maxima are all-reduced (MAX) over `group` when given (the
    dimension they run over is split there), then the saturating cast writes q, transposing it in the same pass
    where the contracted dimension comes first. `both` gives the two layouts at once (Forms), each exactly what
    quantize gives for it. `compiled`: the maxima and the casts are torch.compile'd regions (kernels/options.py),
    one region where no all-reduce sits between them."""

    def __init__(self, compiled: bool = False):
        self._amax = region(local_amax, compiled)
        self._cast, self._cast_transposed = region(cast, compiled), region(cast_transposed, compiled)
        self._cast_both_tensorwise = region(cast_both_tensorwise, compiled)
        self._cast_both_rowwise = region(cast_both_rowwise, compiled)
        self._both_tensorwise, self._both_rowwise = region(both_tensorwise, compiled), region(both_rowwise, compiled)

    def _reduced_amax(self, t: torch.Tensor, dim: Optional[int], group: Optional[dist.ProcessGroup]):
        a = self._amax(t, dim)
        if _splits(group):
            dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
        return a

    def __call__(self, t: torch.Tensor, dtype: torch.dtype, rowwise: bool, contracted: int,
                 group: Optional[dist.ProcessGroup] = None):
        t = t.detach()
        a = self._reduced_amax(t, contracted if rowwise else None, group)
        return self._cast(t, a, dtype) if contracted == 1 else self._cast_transposed(t, a, dtype)

    def both(self, t: torch.Tensor, dtype: torch.dtype, rowwise: bool, group_last: Optional[dist.ProcessGroup] = None,
             group_first: Optional[dist.ProcessGroup] = None) -> Forms:
        """Forms(*quantize(t, ..., 1, group_last), *quantize(t, ..., 0, group_first)). Tensor-wise the two
        layouts share one maximum (the groups are then the same: the tensor's split)."""
        t = t.detach()
        if not rowwise:
            if not _splits(group_last):
                return Forms(*self._both_tensorwise(t, dtype))
            return Forms(*self._cast_both_tensorwise(t, self._reduced_amax(t, None, group_last), dtype))
        if not _splits(group_last) and not _splits(group_first):
            return Forms(*self._both_rowwise(t, dtype))
        return Forms(*self._cast_both_rowwise(t, self._reduced_amax(t, 1, group_last),
                                              self._reduced_amax(t, 0, group_first), dtype))


quantize = Quantizer()  # eager, stateless: what the emulation and the tests call


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale
