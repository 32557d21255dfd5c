"""fp8's quantization on a GPU as one pass a tensor: the casts of a 2-D operand into one or both of its layouts
(contracted along dimension 1: the operand as it is; along dimension 0: its transpose) written by one Triton kernel
that reads each element once, and the absolute maxima by ATen's reductions (one read each).

Why a kernel of its own: torch.compile'd regions of the same arithmetic, traced once per operand shape, ran a
tensor's maximum and its casts at a fraction of the card's bandwidth (an H200 profile of the 8B layer shape:
~490 ms of maxima and casts over a run whose fp8 GEMMs saved ~500), and the transposed layout was a second copy.

Every value is what quantize.py's eager functions give: the scale is computed by the same torch ops, and the
kernel divides with IEEE rounding (`tl.div_rn`, as eager torch divides), clamps, and converts with the hardware's
round-to-nearest-even conversion (tests/kernels/test_fp8_gpu_cast.py holds the two bit for bit on a GPU).
Imported only where Triton is (kernels/options.has_triton).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .quantize import AMAX_FLOOR

BLOCK = 64  # a tile's rows and columns: 4 KiB of fp8 each layout, transposed through shared memory


@triton.jit
def _cast_kernel(t_ptr, rows, cols, stride_r, stride_c, s_last_ptr, s_first_ptr, q_last_ptr, q_first_ptr,
                 TOP: tl.constexpr, ROWWISE: tl.constexpr, LAST: tl.constexpr, FIRST: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # 64-bit offsets: past 2**31 elements
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_r, in_c = r < rows, c < cols
    mask = in_r[:, None] & in_c[None, :]
    x = tl.load(t_ptr + r[:, None] * stride_r + c[None, :] * stride_c, mask=mask, other=0.0).to(tl.float32)
    if LAST:  # [rows, cols], row-major; row-wise: one scale a row
        if ROWWISE:
            s = tl.load(s_last_ptr + r, mask=in_r, other=1.0)[:, None]
        else:
            s = tl.load(s_last_ptr)
        q = tl.minimum(tl.maximum(tl.div_rn(x, s), -TOP), TOP)
        tl.store(q_last_ptr + r[:, None] * cols + c[None, :], q.to(q_last_ptr.dtype.element_ty), mask=mask)
    if FIRST:  # [cols, rows], row-major (the transpose); row-wise: one scale a column of t
        if ROWWISE:
            s = tl.load(s_first_ptr + c, mask=in_c, other=1.0)[None, :]
        else:
            s = tl.load(s_first_ptr)
        q = tl.minimum(tl.maximum(tl.div_rn(x, s), -TOP), TOP)
        tl.store(q_first_ptr + c[None, :] * rows + r[:, None], q.to(q_first_ptr.dtype.element_ty), mask=mask)


def amax(t: torch.Tensor, dim: Optional[int]) -> torch.Tensor:
    """quantize.local_amax in one read: |t|'s maximum (the infinity norm) in t's dtype, exact, then fp32."""
    if dim is None:
        return torch.linalg.vector_norm(t, float("inf")).float()
    return torch.linalg.vector_norm(t, float("inf"), dim=dim, keepdim=True).float()


def _scale(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return a.clamp(min=AMAX_FLOOR) / torch.finfo(dtype).max


def casts(t: torch.Tensor, a_last: Optional[torch.Tensor], a_first: Optional[torch.Tensor], dtype: torch.dtype,
          rowwise: bool, *, block: int = BLOCK, num_warps: int = 4):
    """t [rows, cols] in `dtype`: with a_last, the layout contracted along dimension 1 (t's own) and its scale;
    with a_first, the one contracted along dimension 0 (t transposed, [cols, rows]) and its scale, as
    quantize.cast and quantize.cast_transposed give them; one kernel reads t once for both. block, num_warps: the
    kernel's tile side and warps (experiments/bench/fp8_cast_bench.py times others)."""
    rows, cols = t.shape
    s_last = s_first = q_last = q_first = None
    if a_last is not None:
        s_last = _scale(a_last, dtype)
        q_last = torch.empty((rows, cols), dtype=dtype, device=t.device)
    if a_first is not None:
        s_first = s_last if a_first is a_last else _scale(a_first, dtype)  # tensor-wise: one maximum, one scale
        q_first = torch.empty((cols, rows), dtype=dtype, device=t.device)
    if t.numel():  # a layout not written is handed the other's tensors, which its branch never reads
        grid = (triton.cdiv(rows, block), triton.cdiv(cols, block))
        _cast_kernel[grid](t, rows, cols, t.stride(0), t.stride(1),
                           s_last if s_last is not None else s_first, s_first if s_first is not None else s_last,
                           q_last if q_last is not None else q_first, q_first if q_first is not None else q_last,
                           TOP=torch.finfo(dtype).max, ROWWISE=rowwise, LAST=q_last is not None,
                           FIRST=q_first is not None, BLOCK_R=block, BLOCK_C=block, num_warps=num_warps)
    out = []
    if q_last is not None:
        out += [q_last, s_last]
    if q_first is not None:
        out += [q_first, s_first.reshape(-1, 1) if s_first.dim() else s_first]
    return tuple(out)
