"""A model made tensor- and sequence-parallel from outside, by a declarative plan (torchtitan's
`parallelize_module`): {module or parameter path pattern (fnmatch, relative to the layer): style}. The model is
plain PyTorch; `parallelize_module` swaps in the parallel layers of this folder, slicing the dense weights by rank,
and sets every parameter's placement and tags. One set of layers and styles serves every model.

    Column(in_region)   column-parallel linear (layers.py): output features split. Its input enters the MP region
                        inside the layer's C++ autograd function (Megatron's f, or an all-gather along the sequence
                        under SP), unless `in_region`: a ReplicatedNorm entered it once for several projections
    Row()               row-parallel linear: input features split, the partial outputs summed over MP
                        (all-reduce, or reduce-scatter under SP), the bias added after the sum
    ReplicatedHeads(n)  a projection of n whole heads, fewer than the MP ranks (replicated_heads.py)
    VocabHead(tags)     an LM head column-parallel over the padded vocabulary (vocab_parallel.py), its weight
                        tagged (`tied`, `no_weight_decay`: models/decoder.py's embedding_tags)
    VocabLookup()       a token lookup over a vocabulary-split table; VocabTable(tags) splits and tags that table
    Tags(tags)          a replicated parameter, tagged
    Sequence(enter)     a replicated norm (sequence_parallel.py's ReplicatedNorm): under SP on a sequence chunk with
                        its gradient summed over MP; `enter`: the MP region entered after it
    SequenceRows()      rows of a replicated table taken per sequence chunk under SP (a position table)

Modules are swapped first (each new module allocating only its slices), then parameters split, each in the
plan's order. The layer given is left as it was (a dense model stays usable): the result shares none of its
tensors.
"""
from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear, _mark, _rank_and_size, is_mp_split
from .replicated_heads import ReplicatedHeadsLinear
from .sequence_parallel import ReplicatedNorm, SequenceChunkRows
from .vocab_parallel import VocabParallelLookup, split_table, vocab_parallel_head

__all__ = ["Column", "Row", "ReplicatedHeads", "VocabHead", "VocabLookup", "VocabTable", "Sequence",
           "SequenceRows", "Tags", "parallelize_module"]


@dataclass(frozen=True)
class _Placement:
    """Where a layer is split: its MP group (and size), sequence parallelism, the label of its MP collectives."""

    group: Optional[dist.ProcessGroup]
    size: int
    sequence_parallel: bool
    trace_layer: int


@dataclass(frozen=True)
class Column:
    in_region: bool = False

    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        out = ColumnParallelLinear.from_dense(dense, place.group, sequence_parallel=place.sequence_parallel and
                                              not self.in_region, input_in_region=self.in_region)
        out.trace_layer = place.trace_layer
        return out


@dataclass(frozen=True)
class Row:
    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        out = RowParallelLinear.from_dense(dense, place.group, sequence_parallel=place.sequence_parallel)
        out.trace_layer = place.trace_layer
        return out


@dataclass(frozen=True)
class ReplicatedHeads:
    heads: int

    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        return ReplicatedHeadsLinear(dense, place.group, self.heads)


@dataclass(frozen=True)
class VocabHead:
    tags: dict = field(default_factory=dict)

    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        out = vocab_parallel_head(dense, place.group, place.sequence_parallel)
        out.trace_layer = place.trace_layer
        _tag(out.weight, self.tags)
        return out


@dataclass(frozen=True)
class VocabLookup:
    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        return VocabParallelLookup(place.group, place.sequence_parallel)


@dataclass(frozen=True)
class Sequence:
    enter: bool = False

    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        if not (self.enter and place.size > 1) and not place.sequence_parallel:
            return dense  # a plain norm on the whole sequence, nothing to sum or enter
        return ReplicatedNorm(dense, place.group, place.sequence_parallel, self.enter)


@dataclass(frozen=True)
class SequenceRows:
    def module(self, dense: nn.Module, place: _Placement) -> nn.Module:
        return SequenceChunkRows(place.group) if place.sequence_parallel else dense


@dataclass(frozen=True)
class VocabTable:
    tags: dict = field(default_factory=dict)

    def parameter(self, full: nn.Parameter, place: _Placement) -> nn.Parameter:
        return _tag(split_table(full, place.group), self.tags)


@dataclass(frozen=True)
class Tags:
    tags: dict = field(default_factory=dict)

    def parameter(self, param: nn.Parameter, place: _Placement) -> nn.Parameter:
        return _tag(param, self.tags)


def _tag(param: nn.Parameter, tags: dict) -> nn.Parameter:
    for name, value in tags.items():
        setattr(param, name, value)
    return param


def _set(root: nn.Module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    owner = root.get_submodule(parent)
    if isinstance(value, nn.Parameter):
        owner.register_parameter(name, value)
    elif path:
        setattr(owner, name, value)


def _matches(layer: nn.Module, named, pattern: str, what: str) -> list[str]:
    """The paths of `named` (e.g. layer.named_modules()) that `pattern` matches; ValueError if none does."""
    hits = [n for n, _ in named if fnmatch.fnmatchcase(n, pattern)]
    if not hits:
        raise ValueError(f"parallelize: no {what} of {type(layer).__name__} matches {pattern!r}")
    return hits


def parallelize_module(layer: nn.Module, plan: dict, mp_group: Optional[dist.ProcessGroup],
                       sequence_parallel: bool = False, trace_layer: int = 0) -> nn.Module:
    """A copy of `layer` (dense: no parameter split) made parallel over `mp_group` by `plan`, holding this
    rank's slices of its weights; same parameter names. Every pattern must match (of a block's residual half: every
    pattern of that half's modules). trace_layer: the label of its
    MP collectives on an engine's CommTrace. Parameters no style places are marked replicated."""
    size = _rank_and_size(mp_group)[1]
    place = _Placement(mp_group, size, sequence_parallel and size > 1, trace_layer)
    halves = getattr(layer, "RESIDUAL_HALVES", {})
    if getattr(layer, "part", None) in halves:  # one residual half of a block (parallel/pipeline/units.py)
        plan = {k: v for k, v in plan.items() if k.split(".")[0] in halves[layer.part]}
    split = [name for name, p in layer.named_parameters() if is_mp_split(p)]
    if split:
        raise ValueError(f"parallelize: {type(layer).__name__} is already split over MP ({split[0]})")
    source = list(layer.parameters()) + list(layer.buffers())
    out = copy.deepcopy(layer, {id(t): t for t in source})  # tensors shared until placed, then cloned below
    for pattern, style in plan.items():
        if not hasattr(style, "module"):
            continue
        for path in _matches(layer, out.named_modules(), pattern, "module"):
            _set(out, path, style.module(out.get_submodule(path), place))
    _unshare(out, {id(t) for t in source})
    for pattern, style in plan.items():
        if hasattr(style, "module"):
            continue
        for path in _matches(layer, out.named_parameters(), pattern, "parameter"):
            _set(out, path, style.parameter(out.get_parameter(path), place))
    return out


@torch.no_grad()
def _unshare(module: nn.Module, source: set[int]) -> None:
    """Clone every tensor `module` still shares with the layer it was copied from (keeping its tags)."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None and id(p) in source:
                twin = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                twin.__dict__.update(p.__dict__)
                sub._parameters[name] = twin
                if not hasattr(twin, "mp_split"):
                    _mark(twin, False)
        for name, b in list(sub._buffers.items()):
            if b is not None and id(b) in source:
                sub._buffers[name] = b.clone()
    for p in module.parameters():
        if not hasattr(p, "mp_split"):
            _mark(p, False)


def sequence_param_count(layer: nn.Module, plan: dict) -> int:
    """Parameter tensors of `layer` that `plan` uses on a sequence chunk under sequence parallelism (a Sequence
    style's norm, a Row's bias), each of whose gradients is then all-reduced over MP in every backward: what the
    planner times of them. `layer` may live on the meta device."""
    count = 0
    for pattern, style in plan.items():
        for path in _matches(layer, layer.named_modules(), pattern, "module") if hasattr(style, "module") else ():
            module = layer.get_submodule(path)
            if isinstance(style, Sequence):
                count += sum(1 for _ in module.parameters())
            elif isinstance(style, Row) and getattr(module, "bias", None) is not None:
                count += 1
    return count
