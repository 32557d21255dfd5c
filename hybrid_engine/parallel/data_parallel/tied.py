"""Tied parameters: two copies of one weight on the first and the last pipeline stage, summed gradients.

A model ties a weight by giving two Parameters the same tag, `param.tied = "<name>"` (models/gpt.py ties the
token embedding and the LM head as "word_embeddings"); they start equal. Each copy gets the gradient of its own
use; the weight's true gradient is their sum. Megatron's embedding all-reduce: after the DP sync and before the
overflow check, clipping and the update, each copy's gradient becomes the sum --

    one rank holds both             added locally (pp = 1, or a placement with both ends on one rank)
    first and last stage differ     all-reduce over a two-rank group {the first stage's pp rank, the last
                                    stage's} of the same (dp, mp) coordinates, found through the schedule's
                                    placement (with MP, both copies are the same vocabulary shard)

-- so both copies take the same update and stay equal. In the global gradient norm the weight counts once: the
copy on stage 0 counts, the others do not (`not_counted`).

With the distributed optimizer (ZeRO-1) a bucket is reduce-scattered over DP as soon as its gradients are final,
inside the pipeline's backward, so the sum cannot come first. It comes after, on shards: each copy gets a
gradient bucket of its own (`build_grad_buffer(alone=...)`), the two buckets have the same size and so the same
DP shard boundaries, and DP rank r's shard of one copy covers exactly the elements of its shard of the other.
Summing the shards over the same two-rank group is then the sum of the DP-summed gradients (both sums are
linear), and the two copies' masters and optimizer states, sharded alike, take the same update.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import torch.nn as nn

from typing import Callable

import hybrid_engine._C as _C
from hybrid_engine.parallel.grid import GridGroups


def tied_stages(model: nn.Sequential, layout: list[list[int]]) -> dict[str, list[int]]:
    """{tag: the stages holding a parameter of that tag} of the (possibly meta) whole model; raises ValueError
    (one line) unless every tag's copies sit on the first and the last stage."""
    stage_of = {i: s for s, indices in enumerate(layout) for i in indices}
    found: dict[str, list[int]] = {}
    for index, module in enumerate(model):
        for name, param in module.named_parameters():
            tag = getattr(param, "tied", None)
            if tag is not None:
                found.setdefault(tag, []).append(stage_of[index])
    last = len(layout) - 1
    for tag, stages in found.items():
        if len(stages) != 2 or (last > 0 and sorted(stages) != [0, last]):
            raise ValueError(f"tied parameters '{tag}' must be two copies, one on the first and one on the last "
                             f"pipeline stage; found copies on stages {stages}")
    return found


def _default_timeout() -> datetime.timedelta | None:
    """The default process group's timeout, if this torch exposes it (new groups then fail as fast)."""
    try:
        return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # noqa: BLE001 - private API: fall back to torch's default
        return None


class TiedGradients:
    """Sums the gradients of this rank's tied copies (see the module docstring). Construct it on every rank, in
    the same order relative to other group creation: it creates one group per (dp, mp) pipeline when the first
    and the last stage sit on different pipeline ranks. placement: the schedule's (csrc/schedule/placement.h)."""

    def __init__(self, model: nn.Sequential, layout: list[list[int]], groups: GridGroups,
                 stages: dict[int, nn.Module], placement: str = "loop"):
        self.tags = tied_stages(model, layout)
        self.group: dist.ProcessGroup | None = None
        self._groups_made: list[dist.ProcessGroup] = []
        pp, num_stages = groups.grid.pp_size, len(layout)
        ends = {_C.schedule.stage_rank(s, pp, num_stages, placement) for s in (0, num_stages - 1)}
        if self.tags and len(ends) > 1:
            timeout = _default_timeout()
            for pp_ranks in groups.grid.groups("pp"):
                members = sorted(pp_ranks[end] for end in ends)
                group = dist.new_group(members, timeout=timeout) if timeout else dist.new_group(members)
                if groups.rank in members:
                    self.group = group
                    self._groups_made.append(group)
        # tag -> this rank's copies (model parameters), stage order (stage 0's copy first).
        self.copies: dict[str, list[nn.Parameter]] = {}
        for s in sorted(stages):
            for param in stages[s].parameters():
                tag = getattr(param, "tied", None)
                if tag is not None:
                    self.copies.setdefault(tag, []).append(param)
        first = 0 in stages
        self.not_counted = {id(p) for copies in self.copies.values() for p in (copies[1:] if first else copies)}
        self._grad_of: Callable[[nn.Parameter], torch.Tensor] | None = None
        self.sharded = False

    @property
    def param_ids(self) -> set[int]:
        """id() of every tied copy on this rank."""
        return {id(p) for copies in self.copies.values() for p in copies}

    def bind(self, grad_of: Callable[[nn.Parameter], torch.Tensor], sharded: bool = False) -> None:
        """Where a copy's gradient is once the DP sync is done: grad_of(copy) -> the whole gradient (replicated
        optimizer), or this DP rank's shard of it (sharded: ZeRO-1, each copy alone in its bucket)."""
        self._grad_of, self.sharded = grad_of, sharded
        for tag, copies in self.copies.items():
            shapes = {tuple(grad_of(p).shape) for p in copies}
            if len(shapes) != 1:
                raise ValueError(f"tied parameters '{tag}': this rank's gradients of its copies differ in shape "
                                 f"{sorted(shapes)}")

    def __bool__(self) -> bool:
        return bool(self.copies)

    def describe(self) -> str:
        where = "between the first and last pipeline stage" if self.group is not None else "on one stage"
        how = " (ZeRO: each copy in a bucket of its own, its DP shards summed)" if self.sharded else ""
        return f"tied parameters {', '.join(sorted(self.copies))}: gradients summed {where} before the update{how}"

    @torch.no_grad()
    def sum_grads(self) -> None:
        for tag in sorted(self.copies):
            grads = [self._grad_of(p) for p in self.copies[tag]]
            if any(g is None for g in grads):
                raise RuntimeError(f"tied parameter '{tag}' has no gradient buffer")
            total = grads[0]
            for g in grads[1:]:
                total.add_(g)
            if self.group is not None:
                dist.all_reduce(total, group=self.group)
            for g in grads[1:]:
                g.copy_(total)

    def close(self) -> None:
        for group in self._groups_made:
            dist.destroy_process_group(group)
        self._groups_made.clear()
        self.group = None
