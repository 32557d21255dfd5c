"""Sequence parallelism's communication (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198): the
activations between tensor-parallel layers are [b, s/p, h], this rank's contiguous chunk of the sequence; an
all-gather along the sequence replaces `copy_to` before each column-parallel GEMM and a reduce-scatter replaces
the all-reduce after each row-parallel one. Parameters then used on a sequence chunk -- replicated norms, the
row-parallel biases, a position table -- see only their chunk's tokens; each is used through `copy_to_mp_region`
(identity forward, all-reduce of its gradient backward), so the gradient every rank holds is the full one and
nothing outside these layers changes. (Megatron instead all-reduces them once per step; they carry
`param.sequence_parallel = True` for an engine that wants to.)

The autograd functions are C++ (csrc/tp/sequence_region.h), beside mp_region's: a GPT step calls them thousands
of times, and torch.distributed's Python wrappers (~250 us of host time a call) set the pace of the step on GPUs.
They run one flat collective over the [p, b, s/p, ...] slab layout (sequence_to_slabs); None or a group of one
makes them the identity.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from hybrid_engine.parallel.tensor import ops

from .layers import _rank_and_size


def _check_divisible(length: int, mp_size: int) -> None:
    if length % mp_size:
        raise ValueError(f"sequence parallel: sequence length {length} is not divisible by the model-parallel "
                         f"size {mp_size}")


def gather_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """[b, s/p, ...] chunks -> [b, s, ...] on every rank; backward sums and keeps this rank's chunk."""
    return ops.gather_along_sequence(x, group)


def reduce_scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """[b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum; backward all-gathers."""
    return ops.reduce_scatter_along_sequence(x, group)


def scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """A tensor replicated over MP -> this rank's chunk along dim 1 (e.g. a reference's input entering SP)."""
    return ops.scatter_along_sequence(x, group)


# [b, s, ...] -> [p, b, s/p, ...], contiguous: rank r's sequence chunk is the r-th slab, the layout the flat
# collectives read and write; sequence_from_slabs is its inverse.
sequence_to_slabs = ops.sequence_to_slabs
sequence_from_slabs = ops.sequence_from_slabs


def _sp_param(param: torch.Tensor, group) -> torch.Tensor:
    """A parameter used on a sequence chunk: identity forward, its gradient summed over MP backward."""
    return ops.copy_to_mp_region(param, group)


class ReplicatedNorm(nn.Module):
    """A norm whose parameters are replicated over MP (same names as the model's `norm`, which it runs), and the
    MP region's entry after it when `enter_region`.

    Under sequence parallelism the norm runs on this rank's sequence chunk, its parameters used through
    `_sp_param` (their gradients summed over MP), and entering the region all-gathers the sequence (backward:
    reduce-scatter); without it, entering is Megatron's `f` (identity forward, the input gradient summed over MP
    backward). Entering once here serves every projection that reads the output (a block's q and kv, or gate
    and up), each then a local GEMM. The model's norm must take its parameters as keyword overrides
    (`norm(x, weight=...)`): it is kept, without parameters of its own, to compute."""

    def __init__(self, norm: nn.Module, group: Optional[dist.ProcessGroup], sequence_parallel: bool,
                 enter_region: bool):
        super().__init__()
        self.mp_group = group
        self.sequence_parallel = sequence_parallel and _rank_and_size(group)[1] > 1
        self.enter_region = enter_region
        for name, full in list(norm.named_parameters(recurse=False)):
            param = nn.Parameter(full.detach().clone(), requires_grad=full.requires_grad)
            param.__dict__.update(full.__dict__)
            self.register_parameter(name, param)
            del norm._parameters[name]
            param.mp_split, param.mp_split_dim = False, None
            if self.sequence_parallel:
                param.sequence_parallel = True
        object.__setattr__(self, "norm", norm)  # not a sub-module: its parameters are this module's
        self.param_names = tuple(self._parameters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            params = {name: _sp_param(self._parameters[name], self.mp_group) for name in self.param_names}
        else:
            params = {name: self._parameters[name] for name in self.param_names}
        y = self.norm(x, **params)
        if not self.enter_region:
            return y
        return gather_along_sequence(y, self.mp_group) if self.sequence_parallel else ops.copy_to_mp_region(
            y, self.mp_group)

    def extra_repr(self) -> str:
        return (f"{self.norm!r}, sequence_parallel={self.sequence_parallel}, enter_region={self.enter_region}")


class SequenceChunkRows(nn.Module):
    """rows(table, s): this rank's sequence chunk of a replicated table's first s rows (a position table under
    sequence parallelism), its gradient summed over MP; the model's plain `table[:s]` on the whole sequence."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        super().__init__()
        self.mp_group = group
        self.mp_rank, self.mp_size = _rank_and_size(group)

    def forward(self, table: torch.Tensor, length: int) -> torch.Tensor:
        _check_divisible(length, self.mp_size)
        chunk = length // self.mp_size
        return _sp_param(table, self.mp_group)[self.mp_rank * chunk : (self.mp_rank + 1) * chunk]
