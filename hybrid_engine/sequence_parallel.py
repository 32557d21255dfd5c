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


def _all_gather_seq(x: torch.Tensor, group, mp_size: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(mp_size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_seq(x: torch.Tensor, group, mp_rank: int, mp_size: int) -> torch.Tensor:
    _check_divisible(x.shape[1], mp_size)
    if x.device.type == "cpu":  # gloo (the CPU backend) has no reduce_scatter: all-reduce, keep our chunk
        total = x.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total.chunk(mp_size, dim=1)[mp_rank].contiguous()
    chunks = [c.contiguous() for c in x.chunk(mp_size, dim=1)]
    out = torch.empty_like(chunks[mp_rank])
    dist.reduce_scatter(out, chunks, group=group)
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
