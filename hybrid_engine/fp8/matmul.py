"""A linear layer's three GEMMs in float8 as one autograd function, y = x @ w.T:

    forward   y  = x  @ w.T     x, w  e4m3, scaled along K (row-wise) or whole (tensor-wise)
    backward  dx = dy @ w       dy scaled along N, w along N; dy e5m2 (tensor-wise) or e4m3 (row-wise)
              dw = dy.T @ x     dy and x scaled along M

Each GEMM quantizes its own operands along its contracted dimension (row-wise scales must run along it; the
three GEMMs contract different dimensions), as torchao's row-wise recipe does; tensor-wise scales are the whole
tensor's. `split` says which dimension MP splits ("out": N, a column-parallel layer; "in": K, a row-parallel
one; None): a scale over a split dimension is all-reduced over `group`, so the quantization is the full logical
tensor's on every grid.

Every operand is made contiguous with its contracted dimension last before it is quantized (a transposed copy
where it is not: w for dx, dy and x for dw), as torchao does, so one quantization serves all six.

`native`: torch._scaled_mm (fp8 tensor cores: the left operand row-major, the right column-major, fp32 scales,
a bf16 product); else the emulation, each operand dequantized to fp32 and multiplied in fp32: the same
quantization, the product's rounding aside.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .quantize import E4M3, E5M2, Quantizer, dequantize, quantize as eager_quantize

RECIPES = ("tensorwise", "rowwise")


def _gemm(a: torch.Tensor, bt: torch.Tensor, a_dtype, b_dtype, rowwise: bool, group_a, group_b, native: bool,
          out_dtype: torch.dtype, quantize: Quantizer, fast_accum: bool = False) -> torch.Tensor:
    """a [M, K] @ bt [N, K].T in float8, both operands contiguous with the contracted K last, so each is quantized
    alike: per row along K (rowwise) or whole, its maximum all-reduced over its group. The quantized bt, transposed,
    is the column-major right operand torch._scaled_mm takes. fast_accum: the tensor cores' faster, less exact
    accumulation, which torchao keeps to the forward GEMM (the gradients accumulate exactly)."""
    qa, sa = quantize(a.detach(), a_dtype, 1 if rowwise else None, group_a)
    qb, sb = quantize(bt.detach(), b_dtype, 1 if rowwise else None, group_b)
    if native and a.shape[1] % 16 == 0 and bt.shape[0] % 16 == 0:  # _scaled_mm's alignment: K and N by 16
        out = torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb.t() if rowwise else sb, out_dtype=torch.bfloat16,
                               use_fast_accum=fast_accum)
        return out.to(out_dtype)
    return (dequantize(qa, sa) @ dequantize(qb, sb).t()).to(out_dtype)


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, recipe, split, group, native, quantize):
        rowwise = recipe == "rowwise"
        in_group = group if split == "in" else None
        w_group = group if split is not None else None
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        # contracts K: x's rows and w's rows run along it
        y = _gemm(x2, weight.contiguous(), E4M3, E4M3, rowwise, in_group, in_group if rowwise else w_group, native,
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
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]).contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:  # contracts N: dy's rows and w's columns run along it
            dx = _gemm(dy2, weight.t().contiguous(), grad_dtype, E4M3, rowwise, out_group,
                       out_group if rowwise else w_group, ctx.native, x.dtype, ctx.quantize).view(x.shape)
        if ctx.needs_input_grad[1]:  # contracts M (tokens, never split): only tensor-wise scales see MP
            dw = _gemm(dy2.t().contiguous(), x2.t().contiguous(), grad_dtype, E4M3, rowwise,
                       None if rowwise else out_group, None if rowwise else in_group, ctx.native, weight.dtype,
                       ctx.quantize)
        return dx, dw, None, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, split: Optional[str] = None,
               group: Optional[dist.ProcessGroup] = None, native: bool = False,
               quantize: Quantizer = eager_quantize) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T with the three GEMMs in float8 (the module docstring). Every rank of `group`
    calls it when `split` is set (scales over a split dimension are all-reduced). quantize: its Quantizer (a
    compiled one on CUDA)."""
    if recipe not in RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    if split not in (None, "in", "out"):
        raise ValueError(f"fp8_linear: split must be None, 'in' or 'out', got {split!r}")
    return _Fp8Linear.apply(x, weight, recipe, split, group, native, quantize)
