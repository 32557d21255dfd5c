"""The tensor-parallel linear layers with their GEMMs in float8 (matmul.py), swapped in for a stage's
Linear, ColumnParallelLinear and RowParallelLinear by `to_fp8`, holding the same parameters (names, placement,
tags). The MP region's entry and exit are the same operators the layers use (parallel/tensor/ops.py): Megatron's f
or the all-gather along the sequence before a column-parallel GEMM, the all-reduce or the reduce-scatter after a
row-parallel one; the weight gradient goes back through autograd, whose accumulation the engine's gradient hooks
route into the fp32 main grads (so zero-bubble schedules compute it in B rather than defer it). A layer made with
`cache_weights` takes its weight's fp8 forms from the engine's Fp8WeightCache (`attach_weight_cache`), quantized
once a step."""
from __future__ import annotations

import torch
from torch import nn

from hybrid_engine.parallel.tensor import ops
from hybrid_engine.parallel.tensor.layers import ColumnParallelLinear, Linear, RowParallelLinear

from .matmul import fp8_linear
from .quantize import Quantizer
from .weight_cache import Fp8WeightCache

__all__ = ["Fp8Linear", "to_fp8", "attach_weight_cache"]


class Fp8Linear(nn.Module):
    """One of the tensor-parallel linear layers in float8: `kind` "linear" (no MP), "column" (output features
    split: the region entered before, unless the input entered it already) or "row" (input features split: the
    partial products summed after, the bias added after the sum). `cache_weights`: its weight quantized once a
    step into the engine's cache (`weight_cache`, handed in by attach_weight_cache; None until then)."""

    def __init__(self, layer: nn.Module, recipe: str, native: bool, gpu_kernels: bool = False,
                 cache_weights: bool = False):
        super().__init__()
        self.kind = ("row" if isinstance(layer, RowParallelLinear) else
                     "column" if isinstance(layer, ColumnParallelLinear) else "linear")
        if self.kind == "column" and layer.gather_output:
            raise ValueError("fp8: a column-parallel layer that gathers its output is not converted")
        self.weight, self.bias = layer.weight, layer.bias
        self.mp_group = getattr(layer, "mp_group", None)
        self.mp_size = getattr(layer, "mp_size", 1)
        self.sequence_parallel = bool(getattr(layer, "sequence_parallel", False))
        self.input_in_region = bool(getattr(layer, "input_in_region", False))
        self.recipe, self.native = recipe, native
        self.quantize = Quantizer(gpu_kernels)
        self.cache_weights, self.weight_cache = cache_weights, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.mp_group if self.mp_size > 1 else None
        if self.kind == "column":
            if not self.input_in_region:
                x = (ops.gather_along_sequence(x, group) if self.sequence_parallel
                     else ops.copy_to_mp_region(x, group))
            y = fp8_linear(x, self.weight, self.recipe, "out" if group else None, group, self.native,
                           self.quantize, self.weight_cache)
            return y if self.bias is None else y + self.bias
        if self.kind == "row":
            y = fp8_linear(x, self.weight, self.recipe, "in" if group else None, group, self.native,
                           self.quantize, self.weight_cache)
            y = ops.reduce_scatter_along_sequence(y, group) if self.sequence_parallel else ops.reduce_from_mp_region(
                y, group)
            if self.bias is None:
                return y
            return y + (ops.copy_to_mp_region(self.bias, group) if self.sequence_parallel else self.bias)
        y = fp8_linear(x, self.weight, self.recipe, None, None, self.native, self.quantize, self.weight_cache)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"{self.kind}, weight {tuple(self.weight.shape)}, fp8 {self.recipe}, "
                f"{'torch._scaled_mm' if self.native else 'emulated'}")


def to_fp8(module: nn.Module, recipe: str, native: bool, gpu_kernels: bool = False, cache_weights: bool = False
           ) -> int:
    """Swap every Linear, ColumnParallelLinear and RowParallelLinear under `module` (not `module` itself) for an
    Fp8Linear, in place (`gpu_kernels`: its quantization by gpu_cast.py's kernels; `cache_weights`: its weight's
    fp8 forms from the engine's cache); returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, (Linear, ColumnParallelLinear, RowParallelLinear)):
            setattr(module, name, Fp8Linear(child, recipe, native, gpu_kernels, cache_weights))
            count += 1
        else:
            count += to_fp8(child, recipe, native, gpu_kernels, cache_weights)
    return count


def attach_weight_cache(modules) -> Fp8WeightCache:
    """One Fp8WeightCache for the Fp8Linear layers made with `cache_weights` among `modules` (an owner's stages),
    handed to each: the owner empties it wherever the weights may change (weight_cache.py); it stays empty where
    there are none."""
    cache = Fp8WeightCache()
    for layer in (m for module in modules for m in module.modules()):
        if isinstance(layer, Fp8Linear) and layer.cache_weights:
            layer.weight_cache = cache
    return cache
