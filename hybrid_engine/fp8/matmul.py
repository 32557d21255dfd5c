"""A linear layer's three GEMMs in float8 as one autograd function, y = x @ w.T:

    forward   y  = x  @ w.T     x, w  e4m3, scaled along K (row-wise) or whole (tensor-wise)
    backward  dx = dy @ w       dy scaled along N, w along N; dy e5m2 (tensor-wise) or e4m3 (row-wise)
              dw = dy.T @ x     dy and x scaled along M

Each GEMM quantizes its own operands along its contracted dimension (row-wise scales must run along it; the
three GEMMs contract different dimensions), as torchao's row-wise recipe does; tensor-wise scales are the whole
tensor's. `split` says which dimension MP splits ("out": N, a column-parallel layer; "in": K, a row-parallel
one; None): a scale over a split dimension is all-reduced over `group`, so the quantization is the full logical
tensor's on every grid.

`native`: torch._scaled_mm (fp8 tensor cores: the left operand row-major, the right column-major, fp32 scales,
a bf16 product); else the emulation, each operand dequantized to fp32 and multiplied in fp32: the same
quantization, the product's rounding aside.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .quantize import E4M3, E5M2, dequantize, quantize

RECIPES = ("tensorwise", "rowwise")


def _scaled_mm_fits(m: int, k: int, n: int) -> bool:
    return k % 16 == 0 and n % 16 == 0


def _gemm(a: torch.Tensor, b: torch.Tensor, a_dtype, b_dtype, rowwise: bool, group_a, group_b, native: bool,
          out_dtype: torch.dtype) -> torch.Tensor:
    """a [M, K] @ b [K, N] in float8: a scaled along K per row (rowwise) or whole, b along K per column."""
    qa, sa = quantize(a, a_dtype, 1 if rowwise else None, group_a)
    qb, sb = quantize(b, b_dtype, 0 if rowwise else None, group_b)
    if native and _scaled_mm_fits(a.shape[0], a.shape[1], b.shape[1]):
        # column-major right operand: the transpose of a row-major [N, K]
        out = torch._scaled_mm(qa.contiguous(), qb.t().contiguous().t(), scale_a=sa.reshape(-1, 1) if rowwise else sa,
                               scale_b=sb.reshape(1, -1) if rowwise else sb, out_dtype=torch.bfloat16)
        return out.to(out_dtype)
    return (dequantize(qa, sa) @ dequantize(qb, sb)).to(out_dtype)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, recipe, split, group, native):
        rowwise = recipe == "rowwise"
        in_group = group if split == "in" else None
        w_group = group if split is not None else None
        x2 = x.reshape(-1, x.shape[-1])
        # forward contracts K: x's rows and w's rows run along it
        y = _gemm(x2, weight.t(), E4M3, E4M3, rowwise, in_group, in_group if rowwise else w_group, native, x.dtype)
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.split, ctx.group, ctx.native = recipe, split, group, native
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
        if ctx.needs_input_grad[0]:  # contracts N: dy's rows, w's columns run along it
            dx = _gemm(dy2, weight, grad_dtype, E4M3, rowwise, out_group, out_group if rowwise else w_group,
                       ctx.native, x.dtype).view(x.shape)
        if ctx.needs_input_grad[1]:  # contracts M (tokens, never split): only tensor-wise scales see MP
            dw = _gemm(dy2.t(), x2, grad_dtype, E4M3, rowwise, None if rowwise else out_group,
                       None if rowwise else in_group, ctx.native, weight.dtype)
        return dx, dw, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, split: Optional[str] = None,
               group: Optional[dist.ProcessGroup] = None, native: bool = False) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T with the three GEMMs in float8 (the module docstring). Every rank of `group`
    calls it when `split` is set (scales over a split dimension are all-reduced)."""
    if recipe not in RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    if split not in (None, "in", "out"):
        raise ValueError(f"fp8_linear: split must be None, 'in' or 'out', got {split!r}")
    return _Fp8Linear.apply(x, weight, recipe, split, group, native)
