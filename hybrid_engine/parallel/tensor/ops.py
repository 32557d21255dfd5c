"""The tensor-parallel layer functions, called through torch's dispatcher (torch.ops.hybrid.*, csrc/tp/ops.cpp).

A layer's forward calls these once per layer and micro-batch: through the dispatcher they cost what any torch
operator costs, and their backward is C++ autograd (no Python). Without a group the regions are the identity
(x itself), decided here at no cost. Each takes what the layers hold: a
torch.distributed process group or None (the operators receive its c10d name), the engine's GradBuffer and
CommTrace (the buffer by its address, the trace in the torchbind form `attach` hands the layers) or None.

Fake kernels give every operator's output shape and dtype under FakeTensor (shape propagation, tracing).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

import hybrid_engine._C as _C  # loading the extension registers torch.ops.hybrid

_linear = torch.ops.hybrid.linear.default
_column_parallel_linear = torch.ops.hybrid.column_parallel_linear.default
_row_parallel_linear = torch.ops.hybrid.row_parallel_linear.default
_copy_to_mp_region = torch.ops.hybrid.copy_to_mp_region.default
_reduce_from_mp_region = torch.ops.hybrid.reduce_from_mp_region.default
_gather_from_mp_region = torch.ops.hybrid.gather_from_mp_region.default
_gather_along_sequence = torch.ops.hybrid.gather_along_sequence.default
_reduce_scatter_along_sequence = torch.ops.hybrid.reduce_scatter_along_sequence.default
_scatter_along_sequence = torch.ops.hybrid.scatter_along_sequence.default
_sequence_to_slabs = torch.ops.hybrid.sequence_to_slabs.default
_sequence_from_slabs = torch.ops.hybrid.sequence_from_slabs.default


def _group(group: dist.ProcessGroup) -> tuple:
    """The operators' group arguments: its c10d name, and under torch.compile this process's rank in it too. The
    graph traced through an operator depends on the rank (this rank's slice of a gathered gradient) and torch
    caches compiled graphs by the traced program across a machine's processes: with the rank in the program, one
    rank never runs another's graph."""
    if torch.compiler.is_compiling():
        return group.group_name, group.rank()
    return (group.group_name,)


def _name(group: Optional[dist.ProcessGroup]) -> tuple:
    return (None,) if group is None else _group(group)


def _buffer(grads) -> int:
    """The address of the engine's _C.GradBuffer, the form the operators take (csrc/tp/ops.cpp says why), or 0 for
    none. 0 under torch.compile: a compiled graph can neither hold the engine's buffer nor replay its side effects
    (deferred or main-grad writes, final-gradient announcements), so there the weight gradients go back to
    autograd, whose accumulation the buffer's gradient hooks then route (csrc/grad/grad_hooks.h)."""
    if grads is None or torch.compiler.is_compiling():
        return 0
    return grads.address


def _script(trace):
    """The torchbind form of a _C.CommTrace (what the operators' schemas hold), as is if it is one already; None
    under torch.compile (a graph cannot hold it)."""
    if trace is None or torch.compiler.is_compiling():
        return None
    return trace.script_object if isinstance(trace, _C.CommTrace) else trace


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, grads=None) -> torch.Tensor:
    """x @ weight.T + bias. With `grads` (the engine's GradBuffer) the weight gradient goes where it routes it:
    stashed while it defers (zero-bubble W), else into the weight's fp32 main grad when it has one."""
    return _linear(x, weight, bias, _buffer(grads))


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], grads,
                           group: Optional[dist.ProcessGroup], sequence_parallel: bool = False, trace=None,
                           layer: int = 0) -> torch.Tensor:
    """Megatron's column-parallel linear: (sequence parallel: all-gather x along dim 1) then x @ weight.T + bias on
    this rank's output slice; backward all-reduces (reduce-scatters) the input gradient while the weight
    gradient's GEMM runs."""
    name, *rank = _name(group)
    return _column_parallel_linear(x, weight, bias, _buffer(grads), name, sequence_parallel, _script(trace), layer,
                                   *rank)


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, grads, group: Optional[dist.ProcessGroup],
                        sequence_parallel: bool = False, trace=None, layer: int = 0) -> torch.Tensor:
    """Megatron's row-parallel linear without its bias: x @ weight.T on this rank's input slice, summed over `group`
    (sequence parallel: reduce-scattered along dim 1); the caller adds the bias after the sum."""
    name, *rank = _name(group)
    return _row_parallel_linear(x, weight, _buffer(grads), name, sequence_parallel, _script(trace), layer, *rank)


def copy_to_mp_region(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Megatron f: identity forward, all-reduce(sum) of the gradient over `group` backward. None or a group of one:
    identity (x itself)."""
    return x if group is None else _copy_to_mp_region(x, *_group(group))


def reduce_from_mp_region(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Megatron g: all-reduce(sum) over `group` forward, identity backward."""
    return x if group is None else _reduce_from_mp_region(x, *_group(group))


def gather_from_mp_region(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """All-gather along the last dim forward (rank order); backward keeps this rank's slice of the gradient."""
    return x if group is None else _gather_from_mp_region(x, *_group(group))


def gather_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Sequence parallel: [b, s/p, ...] chunks -> [b, s, ...] on every rank (rank order); backward sums the
    gradient over `group` and keeps this rank's chunk."""
    return x if group is None else _gather_along_sequence(x, *_group(group))


def reduce_scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Sequence parallel: [b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum over `group`;
    backward all-gathers along dim 1."""
    return x if group is None else _reduce_scatter_along_sequence(x, *_group(group))


def scatter_along_sequence(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Sequence parallel: a [b, s, ...] tensor replicated over `group` -> this rank's chunk of dim 1; backward
    all-gathers along dim 1."""
    return x if group is None else _scatter_along_sequence(x, *_group(group))


def sequence_to_slabs(x: torch.Tensor, parts: int) -> torch.Tensor:
    """[b, s, ...] -> [p, b, s/p, ...], contiguous: rank r's sequence chunk is the r-th slab, the layout the flat
    collectives read and write."""
    return _sequence_to_slabs(x, parts)


def sequence_from_slabs(slabs: torch.Tensor) -> torch.Tensor:
    """[p, b, s/p, ...] -> [b, s, ...], the inverse of sequence_to_slabs."""
    return _sequence_from_slabs(slabs)


# ----------------------------------------------------------------------------------------------- fake kernels
def _group_size(name: Optional[str]) -> int:
    return 1 if name is None else dist.distributed_c10d._resolve_process_group(name).size()


def _resized(x: torch.Tensor, dim: int, factor: float) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = int(shape[dim] * factor)
    return x.new_empty(shape)


def _linear_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("hybrid::linear")
def _(x, weight, bias=None, grads=0):
    return _linear_out(x, weight)


@torch.library.register_fake("hybrid::column_parallel_linear")
def _(x, weight, bias, grads, group, sequence_parallel=False, trace=None, layer=0, rank=-1):
    gathered = _resized(x, 1, _group_size(group)) if sequence_parallel else x
    return _linear_out(gathered, weight)


@torch.library.register_fake("hybrid::row_parallel_linear")
def _(x, weight, grads, group, sequence_parallel=False, trace=None, layer=0, rank=-1):
    out = _linear_out(x, weight)
    return _resized(out, 1, 1 / _group_size(group)) if sequence_parallel else out


@torch.library.register_fake("hybrid::copy_to_mp_region")
def _(x, group, rank=-1):
    return x.new_empty(x.shape)


@torch.library.register_fake("hybrid::reduce_from_mp_region")
def _(x, group, rank=-1):
    return x.new_empty(x.shape)


@torch.library.register_fake("hybrid::gather_from_mp_region")
def _(x, group, rank=-1):
    return _resized(x, -1, _group_size(group))


@torch.library.register_fake("hybrid::gather_along_sequence")
def _(x, group, rank=-1):
    return _resized(x, 1, _group_size(group))


@torch.library.register_fake("hybrid::reduce_scatter_along_sequence")
def _(x, group, rank=-1):
    return _resized(x, 1, 1 / _group_size(group))


@torch.library.register_fake("hybrid::scatter_along_sequence")
def _(x, group, rank=-1):
    return _resized(x, 1, 1 / _group_size(group))
