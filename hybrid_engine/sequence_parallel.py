"""Sequence parallelism's communication (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198): the
activations between tensor-parallel layers are [b, s/p, h], this rank's contiguous chunk of the sequence; an
all-gather along the sequence replaces `copy_to` before each column-parallel GEMM and a reduce-scatter replaces
the all-reduce after each row-parallel one (hybrid_engine/tp_transformer.py uses them).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from .tp_layers import _rank_and_size



def _check_divisible(length: int, mp_size: int) -> None:
    if length % mp_size:
        raise ValueError(f"sequence parallel: sequence length {length} is not divisible by the model-parallel "
                         f"size {mp_size}")


def sequence_to_slabs(x: torch.Tensor, mp_size: int) -> torch.Tensor:
    """[b, s, ...] -> [p, b, s/p, ...], contiguous (one copy): rank r's sequence chunk is the r-th slab, the layout
    the flat collectives (all_gather_into_tensor, reduce_scatter_tensor) read and write."""
    b, s = x.shape[:2]
    return x.reshape(b, mp_size, s // mp_size, *x.shape[2:]).movedim(1, 0).contiguous()


def sequence_from_slabs(slabs: torch.Tensor) -> torch.Tensor:
    """[p, b, s/p, ...] -> [b, s, ...], the inverse of sequence_to_slabs."""
    return slabs.movedim(0, 1).flatten(1, 2)


def _all_gather_seq(x: torch.Tensor, group, mp_size: int) -> torch.Tensor:
    x = x.contiguous()
    if x.device.type == "cpu":  # gloo: the list form
        parts = [torch.empty_like(x) for _ in range(mp_size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=1)
    # One flat collective into [p, b, s/p, ...], then one copy into [b, s, ...]. The list form costs NCCL a
    # flatten copy and ~250 us of host time per call (a profile of the GPT at tp=2: the host, not the GPU, set the
    # step's pace); with b == 1 the movedim is free.
    out = torch.empty((mp_size, *x.shape), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    return sequence_from_slabs(out)


def _reduce_scatter_seq(x: torch.Tensor, group, mp_rank: int, mp_size: int) -> torch.Tensor:
    _check_divisible(x.shape[1], mp_size)
    if x.device.type == "cpu":  # gloo (the CPU backend) has no reduce_scatter: all-reduce, keep our chunk
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total.chunk(mp_size, dim=1)[mp_rank].contiguous()
    slabs = sequence_to_slabs(x, mp_size)
    out = torch.empty_like(slabs[0])
    dist.reduce_scatter_tensor(out, slabs, group=group)
    return out


class _GatherSeq(torch.autograd.Function):
    """All-gather along the sequence (dim 1) forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank, ctx.size = _rank_and_size(group)
        return _all_gather_seq(x, group, ctx.size)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group, ctx.rank, ctx.size), None


class _ReduceScatterSeq(torch.autograd.Function):
    """Reduce-scatter along the sequence (dim 1) forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank, ctx.size = _rank_and_size(group)
        return _reduce_scatter_seq(x, group, ctx.rank, ctx.size)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group, ctx.size), None


class _ScatterSeq(torch.autograd.Function):
    """Keep this rank's sequence chunk forward; all-gather backward (inputs replicated over MP enter SP)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        ctx.rank, ctx.size = _rank_and_size(group)
        _check_divisible(x.shape[1], ctx.size)
        return x.chunk(ctx.size, dim=1)[ctx.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group, ctx.size), None


def _single(group) -> bool:
    return group is None or _rank_and_size(group)[1] == 1


def gather_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """[b, s/p, ...] chunks -> [b, s, ...] on every rank; backward sums and keeps this rank's chunk."""
    return x if _single(group) else _GatherSeq.apply(x, group)


def reduce_scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """[b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum; backward all-gathers."""
    return x if _single(group) else _ReduceScatterSeq.apply(x, group)


def scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """A tensor replicated over MP -> this rank's chunk along dim 1 (e.g. a reference's input entering SP)."""
    return x if _single(group) else _ScatterSeq.apply(x, group)


def _sp_param(param: torch.Tensor, group) -> torch.Tensor:
    """A parameter used on a sequence chunk: identity forward, its gradient summed over MP backward."""
    return _C.copy_to_mp_region(param, group)
