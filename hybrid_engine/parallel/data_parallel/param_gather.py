"""ZeRO's parameter all-gather overlapped with the next forward: the order the buckets are gathered in, and which
layer waits for which bucket.

The update (hybrid_engine/optim/zero.py) launches one asynchronous, in-place all-gather per bucket as soon as it has
written this DP rank's piece of that bucket, in the order the next forward reads the buckets
(csrc/executor/dp_param_gather.h). Nothing waits for them at the end of the step: each layer of the next forward
waits only for the buckets holding its own parameters, just before it runs (Megatron's overlap_param_gather), so
the gathers of later layers travel while earlier layers compute.

  native stage     each Linear waits in C++ just before its GEMM (the NativeChainStage's handle to the gather)
  autograd stage   a forward pre-hook on each of the stage's layers (the nn.Sequential's children) waits for the
                   buckets of every parameter inside that layer: a layer may read its sub-modules' parameters
                   functionally (the sequence-parallel GPT block does), so hooks on the sub-modules would miss them
  torch.compile    a hook inside the compiled stage would break its graph: the stage waits for all its buckets
                   before its forward instead

Whatever else reads or writes parameters between steps waits for every gather first (`DpParamGather.wait_all`):
the next update, checkpoint save and load, evaluation, `Engine.stages` / `Engine.parameters` (the user's access)
and `Engine.close`.
"""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

import hybrid_engine._C as _C
from .grad_buffer import BufferLayout


class ForwardWaits:
    """The parameter gather of one engine and, per layer, the buckets it waits for (from the buffer layout)."""

    def __init__(self, gather: _C.DpParamGather, layout: BufferLayout):
        self.gather = gather
        # What a layer calls for each of its buckets: wait for its gather, or (ZeRO-3, param_shards.py) gather it
        # and launch the ones ahead.
        self.use: Callable[[int], None] = gather.wait
        self.bucket_of = {id(p): b for b, members in enumerate(layout.members) for p, _ in members}

    def buckets_of(self, module: nn.Module) -> list[int]:
        """The buckets holding `module`'s parameters (its sub-modules' included), in first-use order."""
        return list(dict.fromkeys(self.bucket_of[id(p)] for p in module.parameters() if id(p) in self.bucket_of))

    def launch_order(self, stages: dict[int, nn.Sequential]) -> list[int]:
        """Every bucket in the order the next forward reads them: stages in order, each stage's layers in order
        (a bucket holds consecutive layers, packed last to first for the backward)."""
        order = [b for s in sorted(stages) for layer in stages[s] for b in self.buckets_of(layer)]
        return list(dict.fromkeys(order + sorted(set(self.bucket_of.values()))))  # + any no layer holds

    def hook_layers(self, stage: nn.Sequential) -> None:
        """Each layer of an autograd stage waits for its buckets just before its forward."""
        for layer in stage:
            buckets = self.buckets_of(layer)
            if buckets:
                layer.register_forward_pre_hook(_waiter(self, buckets))

    def stage_waiter(self, stage: nn.Sequential) -> Callable[[], None]:
        """A compiled stage's one wait, for all its buckets, before its forward."""
        wait = _waiter(self, self.buckets_of(stage))
        return lambda: wait(stage, ())


def _waiter(waits: ForwardWaits, buckets: list[int]):
    def wait(module: nn.Module, args) -> None:
        for b in buckets:
            waits.use(b)  # nothing in flight (every later call of the step, a recomputation): returns at once

    return wait


def describe(overlap: bool, dp_size: int, native: list[int], hooked: list[int], compiled: list[int]) -> str:
    """The announcement of how the updated parameters come back to every replica (ZeRO-1)."""
    if dp_size == 1:
        return "zero: one DP rank, no parameter all-gather"
    if not overlap:
        return ("zero: parameter all-gather per bucket at the end of the step, waited for there (exposed; "
                "--overlap-param-gather overlaps it with the next forward)")
    ways = [f"stage{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} {how}" for ids, how in (
        (native, "layer by layer in C++"), (hooked, "layer by layer (forward pre-hooks)"),
        (compiled, "once before the stage's forward (torch.compile)")) if ids]
    return ("zero: parameter all-gather overlapped with the next forward, per bucket (launched as each bucket's "
            f"shard is updated; waited for {'; '.join(ways)})")
