"""A linear layer's three GEMMs in float8 as one autograd function, y = x @ w.T:

    forward   y  = x  @ w.T     x, w  e4m3, scaled along K (row-wise) or whole (tensor-wise)
    backward  dx = dy @ w       dy scaled along N, w along N; dy e5m2 (tensor-wise) or e4m3 (row-wise)
              dw = dy.T @ x     dy and x scaled along M

Each GEMM reads its operands quantized along its contracted dimension (row-wise scales must run along it; the
three GEMMs contract different dimensions), as torchao's row-wise recipe does; tensor-wise scales are the whole
tensor's. `split` says which dimension MP splits ("out": N, a column-parallel layer; "in": K, a row-parallel
one; None): a scale over a split dimension is all-reduced over `group`, so the quantization is the full logical
tensor's on every grid.

Every operand is quantized with its contracted dimension last: where it comes first (w for dx, dy and x for dw)
the cast writes the transpose in the same pass, so no transposed copy in the operand's own dtype is made. A tensor
two GEMMs read is quantized in both layouts at once (Quantizer.both: one maximum tensor-wise, one read of it): x
in the forward, which keeps for dw only x's transposed fp8 form and its scale (half the bytes of the bf16 x), dy
at the backward's start. The weight's two forms come from the engine's Fp8WeightCache when it has one (quantized
once a step), else the forward's and dx's are quantized where each GEMM needs them. Each form is exactly what
quantizing that operand for that GEMM alone gives, so the products are too.

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
from .weight_cache import Fp8WeightCache


def scaled_product(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, rowwise: bool, native: bool,
             out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """qa [m, k] (row-major, k contracted) times qb [n, k] transposed: [m, n] in out_dtype. The quantized b,
    transposed, is the column-major right operand torch._scaled_mm takes. fast_accum: the tensor cores' faster,
    less exact accumulation, which torchao keeps to the forward GEMM (the gradients accumulate exactly)."""
    if native and qa.shape[1] % 16 == 0 and qb.shape[0] % 16 == 0:  # _scaled_mm's alignment: K and N by 16
        if rowwise:  # [M, 1] and [1, N], each with a unit stride along its length, as _scaled_mm checks
            sa, sb = sa.reshape(-1).unsqueeze(1), sb.reshape(-1).unsqueeze(0)
        out = torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
        return out.to(out_dtype)
    return (dequantize(qa, sa) @ dequantize(qb, sb).t()).to(out_dtype)


def operand_groups(split: Optional[str], group, rowwise: bool) -> dict:
    """Which MP group each maximum is all-reduced over (None: none), by operand and layout: the maxima along a
    dimension MP splits, and tensor-wise every maximum of a tensor MP splits."""
    out_group = group if split == "out" else None
    in_group = group if split == "in" else None
    w_group = group if split is not None else None
    return dict(x_last=in_group, x_first=None if rowwise else in_group,
                w_last=in_group if rowwise else w_group, w_first=out_group if rowwise else w_group,
                dy_last=out_group, dy_first=None if rowwise else out_group)


def weight_forms(weight: torch.Tensor, rowwise: bool, groups: dict, quantize: Quantizer):
    """Both of the weight's forms (the forward's: along K; dx's: along N), e4m3."""
    return quantize.both(weight, E4M3, rowwise, groups["w_last"], groups["w_first"])


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, recipe, split, group, native, quantize, weights, wants_dw):
        rowwise = recipe == "rowwise"
        groups = operand_groups(split, group, rowwise)
        x2 = x.reshape(-1, x.shape[-1])
        if wants_dw:  # x's forward form now, its dw form kept for the backward
            qx, sx, qx_first, sx_first = quantize.both(x2, E4M3, rowwise, groups["x_last"], groups["x_first"])
        else:
            qx, sx = quantize(x2, E4M3, rowwise, 1, groups["x_last"])
        if weights is not None and not torch.compiler.is_compiling():
            qw, sw = weights.forms(weight, rowwise, lambda: weight_forms(weight, rowwise, groups, quantize))[:2]
        else:
            weights = None
            qw, sw = quantize(weight, E4M3, rowwise, 1, groups["w_last"])
        # y = x w.T contracts K: x's dimension 1, w's dimension 1
        y = scaled_product(qx, sx, qw, sw, rowwise, native, x.dtype, fast_accum=True)
        ctx.save_for_backward(*((qx_first, sx_first) if wants_dw else ()), weight)
        ctx.recipe, ctx.groups, ctx.native, ctx.quantize, ctx.weights = recipe, groups, native, quantize, weights
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        *x_first, weight = ctx.saved_tensors
        rowwise, groups, quantize = ctx.recipe == "rowwise", ctx.groups, ctx.quantize
        grad_dtype = E4M3 if rowwise else E5M2
        dy2 = dy.reshape(-1, dy.shape[-1])
        wants_dx, wants_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1] and bool(x_first)
        if wants_dx and wants_dw:
            qdy, sdy, qdy_first, sdy_first = quantize.both(dy2, grad_dtype, rowwise, groups["dy_last"],
                                                           groups["dy_first"])
        elif wants_dx:
            qdy, sdy = quantize(dy2, grad_dtype, rowwise, 1, groups["dy_last"])
        elif wants_dw:
            qdy_first, sdy_first = quantize(dy2, grad_dtype, rowwise, 0, groups["dy_first"])
        dx = dw = None
        if wants_dx:  # dx = dy w contracts N: dy's dimension 1, w's dimension 0
            if ctx.weights is not None:
                qw_first, sw_first = ctx.weights.forms(weight, rowwise,
                                                       lambda: weight_forms(weight, rowwise, groups, quantize))[2:]
            else:
                qw_first, sw_first = quantize(weight, E4M3, rowwise, 0, groups["w_first"])
            dx = scaled_product(qdy, sdy, qw_first, sw_first, rowwise, ctx.native, ctx.x_dtype).view(ctx.x_shape)
        if wants_dw:  # dw = dy.T x contracts M (tokens, never split): only tensor-wise scales see MP
            dw = scaled_product(qdy_first, sdy_first, *x_first, rowwise, ctx.native, weight.dtype)
        return dx, dw, None, None, None, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, split: Optional[str] = None,
               group: Optional[dist.ProcessGroup] = None, native: bool = False,
               quantize: Quantizer = eager_quantize, weights: Optional[Fp8WeightCache] = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T with the three GEMMs in float8 (the module docstring). Every rank of `group`
    calls it when `split` is set (scales over a split dimension are all-reduced). quantize: its Quantizer (one
    with the GPU's kernels on CUDA); weights: the engine's Fp8WeightCache (None: the weight quantized every
    call)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if split not in (None, "in", "out"):
        raise ValueError(f"fp8_linear: split must be None, 'in' or 'out', got {split!r}")
    wants_dw = torch.is_grad_enabled() and weight.requires_grad  # else no backward reads x's dw form
    return _Fp8Linear.apply(x, weight, recipe, split, group, native, quantize, weights, wants_dw)
