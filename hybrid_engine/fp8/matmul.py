"""A linear layer's three GEMMs in float8 as one autograd function, y = x @ w.T:

    forward   y  = x  @ w.T     x, w  e4m3, scaled along K (row-wise) or whole (tensor-wise)
    backward  dx = dy @ w       dy scaled along N, w along N; dy e5m2 (tensor-wise) or e4m3 (row-wise)
              dw = dy.T @ x     dy and x scaled along M

Each GEMM quantizes its own operands along its contracted dimension (row-wise scales must run along it; the
three GEMMs contract different dimensions), as torchao's row-wise recipe does; tensor-wise scales are the whole
tensor's. `split` says which dimension MP splits ("out": N, a column-parallel layer; "in": K, a row-parallel
one; None): a scale over a split dimension is all-reduced over `group`, so the quantization is the full logical
tensor's on every grid.

Every operand is quantized with its contracted dimension last: where it comes first (w for dx, dy and x for dw)
the cast writes the transpose in the same pass, so no transposed copy in the operand's own dtype is made.

`native`: torch._scaled_mm (fp8 tensor cores: the left operand row-major, the right column-major, fp32 scales,
a bf16 product); else the emulation, each operand dequantized to fp32 and multiplied in fp32: the same
quantization, the product's rounding aside.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hybrid_engine.kernels.options import FP8_RECIPES

from .quantize import E4M3, E5M2, Quantizer, dequantize, quantize as eager_quantize


def _gemm(a: torch.Tensor, a_contracted: int, b: torch.Tensor, b_contracted: int, a_dtype, b_dtype, rowwise: bool,
          group_a, group_b, native: bool, out_dtype: torch.dtype, quantize: Quantizer,
          fast_accum: bool = False) -> torch.Tensor:
    """The product of two 2-D operands over their contracted dimensions (a's `a_contracted`, b's `b_contracted`,
    each 0 or 1) in float8: [a's other dimension, b's other dimension]. Each is quantized with the contracted
    dimension last (transposed in the cast where it comes first); the quantized b, transposed back, is the
    column-major right operand torch._scaled_mm takes. fast_accum: the tensor cores' faster, less exact
    accumulation, which torchao keeps to the forward GEMM (the gradients accumulate exactly)."""
    qa, sa = quantize(a, a_dtype, rowwise, a_contracted, group_a)
    qb, sb = quantize(b, b_dtype, rowwise, b_contracted, group_b)
    if native and qa.shape[1] % 16 == 0 and qb.shape[0] % 16 == 0:  # _scaled_mm's alignment: K and N by 16
        if rowwise:  # [M, 1] and [1, N], each with a unit stride along its length, as _scaled_mm checks
            sa, sb = sa.reshape(-1).unsqueeze(1), sb.reshape(-1).unsqueeze(0)
        out = torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
        return out.to(out_dtype)
    return (dequantize(qa, sa) @ dequantize(qb, sb).t()).to(out_dtype)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, recipe, split, group, native, quantize):
        rowwise = recipe == "rowwise"
        in_group = group if split == "in" else None
        w_group = group if split is not None else None
        x2 = x.reshape(-1, x.shape[-1])
        # y = x w.T contracts K: x's dimension 1, w's dimension 1
        y = _gemm(x2, 1, weight, 1, E4M3, E4M3, rowwise, in_group, in_group if rowwise else w_group, native,
                  x.dtype, quantize, fast_accum=True)
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.split, ctx.group, ctx.native, ctx.quantize = recipe, split, group, native, quantize
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        rowwise = ctx.recipe == "rowwise"
        grad_dtype = E4M3 if rowwise else E5M2
        out_group = ctx.group if ctx.split == "out" else None
        in_group = ctx.group if ctx.split == "in" else None
        w_group = ctx.group if ctx.split is not None else None
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = dw = None
        if ctx.needs_input_grad[0]:  # dx = dy w contracts N: dy's dimension 1, w's dimension 0
            dx = _gemm(dy2, 1, weight, 0, grad_dtype, E4M3, rowwise, out_group, out_group if rowwise else w_group,
                       ctx.native, x.dtype, ctx.quantize).view(x.shape)
        if ctx.needs_input_grad[1]:  # dw = dy.T x contracts M (tokens, never split): only tensor-wise scales see MP
            dw = _gemm(dy2, 0, x2, 0, grad_dtype, E4M3, rowwise, None if rowwise else out_group,
                       None if rowwise else in_group, ctx.native, weight.dtype, ctx.quantize)
        return dx, dw, None, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, split: Optional[str] = None,
               group: Optional[dist.ProcessGroup] = None, native: bool = False,
               quantize: Quantizer = eager_quantize) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T with the three GEMMs in float8 (the module docstring). Every rank of `group`
    calls it when `split` is set (scales over a split dimension are all-reduced). quantize: its Quantizer (a
    compiled one on CUDA)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if split not in (None, "in", "out"):
        raise ValueError(f"fp8_linear: split must be None, 'in' or 'out', got {split!r}")
    return _Fp8Linear.apply(x, weight, recipe, split, group, native, quantize)
