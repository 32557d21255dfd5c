"""Dynamic float8 scaling: an operand's absolute maximum, over the whole tensor (tensor-wise) or along the GEMM's
contracted dimension (row-wise: one scale a row of the left operand, one a column of the right), gives the scale
that maps it onto the float8 range; the cast saturates.

Under tensor parallelism a scale must be the full logical tensor's, so every grid quantizes alike: where the
dimension an absolute maximum runs over is split over MP, the maxima are all-reduced (MAX) over the MP group.

A tensor that two GEMMs read with different contracted dimensions (x in the forward and in dw, dy in dx and in dw,
w in the forward and in dx) is quantized in both layouts at once (`Quantizer.both`): it is read once for the casts,
and a tensor-wise scale, the same for both, is reduced once. On a GPU the casts are one Triton kernel a tensor and
the maxima ATen's reductions (gpu_cast.py); elsewhere, and inside a region torch.compile traces, the eager
functions below, which the kernel matches bit for bit.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

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
    quantize gives for it. `gpu_kernels`: the maxima and casts run as gpu_cast.py's kernels (a CUDA device with
    Triton, kernels/options.py), else as the eager functions above."""

    def __init__(self, gpu_kernels: bool = False):
        self.gpu_kernels = gpu_kernels
        self._kernels = None

    def _on_gpu(self, t: torch.Tensor) -> bool:
        """Whether t's quantization runs gpu_cast.py's kernels (imported at the first: Triton is a GPU's). A region
        torch.compile traces gets the eager functions, which it fuses itself."""
        if not (self.gpu_kernels and t.is_cuda) or torch.compiler.is_compiling():
            return False
        if self._kernels is None:
            from . import gpu_cast
            self._kernels = gpu_cast
        return True

    def _reduced_amax(self, t: torch.Tensor, dim: Optional[int], group: Optional[dist.ProcessGroup]):
        a = self._kernels.amax(t, dim) if self._on_gpu(t) else local_amax(t, dim)
        if _splits(group):
            dist.all_reduce(a, op=dist.ReduceOp.MAX, group=group)
        return a

    def __call__(self, t: torch.Tensor, dtype: torch.dtype, rowwise: bool, contracted: int,
                 group: Optional[dist.ProcessGroup] = None):
        t = t.detach()
        a = self._reduced_amax(t, contracted if rowwise else None, group)
        if self._on_gpu(t):
            return self._kernels.casts(t, a if contracted == 1 else None, a if contracted == 0 else None, dtype,
                                       rowwise)
        return cast(t, a, dtype) if contracted == 1 else cast_transposed(t, a, dtype)

    def both(self, t: torch.Tensor, dtype: torch.dtype, rowwise: bool, group_last: Optional[dist.ProcessGroup] = None,
             group_first: Optional[dist.ProcessGroup] = None) -> Forms:
        """Forms(*quantize(t, ..., 1, group_last), *quantize(t, ..., 0, group_first)). Tensor-wise the two
        layouts share one maximum (the groups are then the same: the tensor's split)."""
        t = t.detach()
        if rowwise:
            a_last, a_first = self._reduced_amax(t, 1, group_last), self._reduced_amax(t, 0, group_first)
        else:
            a_last = a_first = self._reduced_amax(t, None, group_last)
        if self._on_gpu(t):
            return Forms(*self._kernels.casts(t, a_last, a_first, dtype, rowwise))
        if rowwise:
            return Forms(*cast_both_rowwise(t, a_last, a_first, dtype))
        return Forms(*cast_both_tensorwise(t, a_last, dtype))


quantize = Quantizer()  # eager, stateless: what the emulation and the tests call


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale
