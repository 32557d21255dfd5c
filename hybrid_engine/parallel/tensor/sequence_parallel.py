"""Sequence parallelism's communication (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198): the
activations between tensor-parallel layers are [b, s/p, h], this rank's contiguous chunk of the sequence; an
all-gather along the sequence replaces `copy_to` before each column-parallel GEMM and a reduce-scatter replaces
the all-reduce after each row-parallel one (hybrid_engine/models/gpt/parallelize.py uses them).

The autograd functions are C++ (csrc/tp/sequence_region.h), beside mp_region's: a GPT step calls them thousands
of times, and torch.distributed's Python wrappers (~250 us of host time a call) set the pace of the step on GPUs.
They run one flat collective over the [p, b, s/p, ...] slab layout (sequence_to_slabs); None or a group of one
makes them the identity.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hybrid_engine.parallel.tensor import ops


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
