"""The distributed optimizer (ZeRO stages 1-3; Megatron's distributed optimizer, FSDP's sharding): optimizer state,
gradients and parameters sharded over the data-parallel ranks.

Every gradient bucket is reduce-scattered instead of all-reduced (csrc/executor/dp_grad_sync.h, `shard`): shard rank
r then holds the summed gradient of the r-th equal piece of each bucket, and keeps fp32 masters and optimizer state
for that piece only. Parameters live in flat buffers laid out exactly like the gradient buckets, so a bucket's
shard of gradients, of masters and of parameters cover the same elements. Who shares one sharded copy, and how
copies are combined (hybrid sharding), is parallel/data_parallel/shard_groups.py.

  stage 1  the gradient buckets stay whole (the reduce-scatter leaves the rest of each unspecified); the step
           updates the shard and all-gathers each parameter buffer, bucket by bucket, each gather launched as soon
           as its shard is written and waited for only by the next forward's first layer that reads it
           (parallel/data_parallel/param_gather.py; `overlap=False` waits for them all at the end of the step).
  stage 2  as 1, and each bucket's summed piece is copied into a gradient shard of its own as soon as its
           reduce-scatter is done, the bucket's bytes released until the next step's backward (`keep_shards`).
  stage 3  as 2, and the parameter buffers are released between steps: this rank keeps its piece of each, which
           the update writes; the step gathers them ahead of the forward (parallel/data_parallel/param_shards.py).

The optimizer sees one flat tensor per bucket shard, so it must be elementwise (SGD, Adam, AdamW: what Megatron's
distributed optimizer supports); a shard may cut a parameter anywhere. Decisions that need the whole gradient are
agreed over the ranks that hold its pieces: the fp16 overflow flag over the world (DP too, since no rank sees all
gradients), the clipping norm summed over the ranks whose shards make up the model once (MP-replicated parameters
counted once).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

import hybrid_engine._C as _C
from . import optimizers as optim
from .zero_state import ShardedState
from hybrid_engine.optim.scaling import clip_grad_norm
from hybrid_engine.parallel.data_parallel.grad_buffer import BufferLayout
from hybrid_engine.parallel.data_parallel.param_gather import ForwardWaits
from hybrid_engine.parallel.data_parallel.param_shards import ParamShards
from hybrid_engine.parallel.data_parallel.shard_groups import ShardGroups
from hybrid_engine.parallel.tensor.layers import is_mp_split


class ShardedOptimizer(ShardedState):
    """ZeRO-1/2/3 over the engine's gradient buffer: the optimizer of this rank's shard, and the step."""

    fuses_unscale = False

    def __init__(self, factory: optim.OptimizerFactory, layout: BufferLayout, half_weights: bool, groups,
                 shards: ShardGroups, level: int, device: torch.device, stages: dict[int, nn.Sequential],
                 overlap: bool = True, comm_trace: _C.CommTrace | None = None,
                 not_counted: set[int] = frozenset(), prefetch: int = 1, native_stages: set[int] = frozenset(),
                 reshard_stages: set[int] = frozenset(), reduce_every_micro: bool = False):
        self.layout, self.groups, self.device, self.level = layout, groups, device, level
        self.reduce_every_micro = reduce_every_micro  # stage 2/3: each micro-batch's gradients into the shards
        self.shard_groups = shards
        self.dp_rank, self.dp_size = shards.rank, shards.size
        self.half_weights, self.clip_group = half_weights, shards.clip
        self.world = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
        self.param_flats: list[torch.Tensor] = []
        for b, members in enumerate(layout.members):
            flat = torch.zeros(layout.grads.buckets[b].numel(), dtype=members[0][0].dtype, device=device)
            with torch.no_grad():
                for p, offset in members:
                    flat[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
                    p.data = flat[offset : offset + p.numel()].view_as(p)  # the parameter now lives in the buffer
            self.param_flats.append(flat)
        self.shards = [layout.grads.bucket_shard(b, self.dp_rank, self.dp_size) for b in range(len(self.param_flats))]
        buckets = layout.grads.buckets
        # Stage 2 and 3: a gradient shard of its own per bucket, which the DP sync fills as the bucket is released.
        self.grad_shards = [buckets[b][s:e] if level < 2 else buckets[b].new_zeros(e - s)
                            for b, (s, e) in enumerate(self.shards)]
        # The overlap of the gathers with the next forward: each layer waits for its own bucket (stage 3 always:
        # DataParallelConfig refuses it otherwise).
        self.overlap = overlap
        self.gather = _C.DpParamGather(self.param_flats, shards.shard, comm_trace)
        self.waits = ForwardWaits(self.gather, layout)
        self.launch_order = self.waits.launch_order(stages)
        self.params: ParamShards | None = None
        self.resharded: list[int] = []  # stage 3: stages gathered again for the backward (param_shards.py)
        if level == 3:
            native_buckets = {b for s in native_stages for b in layout.stage_buckets.get(s, [])}
            self.params = ParamShards(self.param_flats, self.shards, self.gather, self.launch_order, prefetch,
                                      native_buckets)
            self.waits.use = self.params.use
            for s in sorted(reshard_stages):  # autograd stages without a pipeline: gathered again for the backward
                self.params.reshard_after_forward(list(stages[s]), self.waits.buckets_of)
            self.resharded = sorted(reshard_stages)
            self.param_shards = self.params.pieces
        else:
            self.param_shards = [self.param_flats[b][s:e] for b, (s, e) in enumerate(self.shards)]
        # fp32 masters of the shard: the parameter shard itself for fp32 weights, an fp32 copy for half weights.
        self.masters = [nn.Parameter(ps.detach().float().clone() if half_weights else ps) for ps in self.param_shards]
        for master, grad in zip(self.masters, self.grad_shards):
            master.grad = grad
        # What the optimizer steps: each shard whole, or (an AdamW that decays matrices only) cut where decayed
        # and undecayed parameters meet, each piece a view of the shard tagged for optimizers.decays.
        by_decay = getattr(factory, "groups_by_decay", False)
        self.pieces = [self._pieces(b) if by_decay else [(0, m.numel(), m)] for b, m in enumerate(self.masters)]
        stepped = [t for pieces in self.pieces for _, _, t in pieces]
        self.optimizer = factory(stepped or [nn.Parameter(torch.zeros(1, device=device))])
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory must return a torch.optim.Optimizer, got "
                            f"{type(self.optimizer).__name__}")
        self.fused = half_weights and isinstance(factory, optim.SGD) and factory.plain
        self.fuses_unscale = self.fused
        # not_counted: id() of parameters left out of the clipping norm (a tied weight's second copy), still scaled.
        self._not_counted = not_counted
        self._split, self._replicated = self._norm_segments()

    def describe(self) -> str:
        how = "fused SGD + master -> half cast" if self.fused else "torch step"
        what = {1: "optimizer state", 2: "optimizer state and gradients",
                3: "optimizer state, gradients and parameters"}[self.level]
        when = ""
        if self.level >= 2:
            when = ("; gradients reduce-scattered after every micro-batch's backward, a bucket allocated at its first "
                    "write and released once reduced" if self.reduce_every_micro else
                    "; gradients reduce-scattered once, after the step's last backward (a pipeline stage's "
                    "micro-batches interleave: reducing each would move the gradients m times)")
        return (f"optimizer: {type(self.optimizer).__name__} (ZeRO-{self.level}: {what} "
                f"{self.shard_groups.describe()}; {how}{when}): "
                f"{(self.master_bytes() + optim.state_bytes(self.optimizer)) / 2**20:.1f} MiB of masters and "
                "optimizer state on this rank")

    def keep_shards(self) -> list[torch.Tensor]:
        """What the DP sync copies each bucket's summed piece into before releasing the bucket (stage 2 and 3)."""
        return self.grad_shards if self.level >= 2 else []

    def _norm_segments(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """This shard's gradient, cut at parameter boundaries: MP-split pieces and MP-replicated pieces."""
        split, replicated = [], []
        for b, (start, end) in enumerate(self.shards):
            for p, offset in self.layout.members[b]:
                lo, hi = max(start, offset), min(end, offset + p.numel())
                if lo < hi and id(p) not in self._not_counted:
                    (split if is_mp_split(p) else replicated).append(self.grad_shards[b][lo - start:hi - start])
        return split, replicated

    def _pieces(self, b: int) -> list[tuple[int, int, torch.Tensor]]:
        """(start, end, tensor) of bucket b's shard, cut into runs of parameters that are decayed alike (padding
        joins the run before it); one run is the shard itself."""
        start, end = self.shards[b]
        runs: list[list] = []
        for p, offset in self.layout.members[b]:
            lo, hi = max(start, offset) - start, min(end, offset + p.numel()) - start
            if lo >= hi:
                continue
            if runs and runs[-1][2] == optim.decays(p):
                runs[-1][1] = hi
            else:
                runs.append([lo, hi, optim.decays(p)])
        master = self.masters[b]
        if len(runs) <= 1:
            if runs:
                master.no_weight_decay = not runs[0][2]
            return [(0, master.numel(), master)]
        runs[0][0], runs[-1][1] = 0, master.numel()
        for before, after in zip(runs, runs[1:]):
            after[0] = before[1]
        pieces = []
        for lo, hi, decayed in runs:
            piece = nn.Parameter(master.detach()[lo:hi])  # a view: the optimizer writes the shard itself
            piece.grad = self.grad_shards[b][lo:hi]
            piece.no_weight_decay = not decayed
            pieces.append((lo, hi, piece))
        return pieces

    def grad_shard_of(self, param: nn.Parameter) -> torch.Tensor:
        """This rank's shard of the gradient bucket that holds `param` alone (build_grad_buffer's `alone`)."""
        for b, members in enumerate(self.layout.members):
            if any(p is param for p, _ in members):
                if len(members) != 1:
                    raise RuntimeError("ZeRO: a tied copy must have a gradient bucket of its own")
                return self.grad_shards[b]
        raise KeyError("ZeRO: parameter not in this rank's gradient buckets")

    def master_bytes(self) -> int:
        """Bytes of this rank's fp32 master shards when they are copies (half weights; else 0: the parameter
        shards are their own masters)."""
        return sum(m.numel() * m.element_size() for m in self.masters) if self.half_weights else 0

    def held_bytes(self) -> tuple[int, int]:
        """(parameter bytes, gradient bytes) this rank holds now: whole buffers not released, and shards kept
        beside them (stage 2's gradient shards, stage 3's parameter pieces)."""
        def whole(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors if not _C.storage_released(t))

        params = self.params.held_bytes() if self.params is not None else whole(self.param_flats)
        grads = whole(self.layout.grads.buckets)
        if self.level >= 2:
            grads += sum(g.numel() * g.element_size() for g in self.grad_shards)
        return params, grads

    # ------------------------------------------------------------------------------------------------- step
    def begin_step(self) -> None:
        """Before the step's first forward: stage 3 starts gathering the first buckets."""
        if self.params is not None:
            self.params.begin_step()

    def end_backward(self) -> None:
        """After the step's last backward: stage 3 releases the parameter buffers."""
        if self.params is not None:
            self.params.release_all()

    def wait_for_parameters(self) -> None:
        """Every parameter whole and in place: the gathers in flight finished (stage 3: every bucket gathered,
        kept until the next step's backward is over)."""
        if self.params is not None:
            self.params.gather_all()
        else:
            self.gather.wait_all()

    @torch.no_grad()
    def update(self, scaler, clip_grad: float) -> tuple[torch.Tensor | None, bool, float | None]:
        """The optimizer's side of a step, as Engine._update: (device overflow flag or None, skipped, norm)."""
        self.gather.wait_all()  # a bucket no layer read is still in flight: its shard is about to be written
        if scaler is not None and self.fused and clip_grad <= 0:
            found_inf = scaler.find_nonfinite(self.grad_shards, self.world, self.device)
            lr = float(self.optimizer.param_groups[0]["lr"])
            self._publish(lambda b: _C.sgd_step_and_cast([self.masters[b]], [self.grad_shards[b]],
                                                         [self.param_shards[b]], lr, inv_scale=scaler.inv_scale,
                                                         skip_if=found_inf))
            return found_inf, False, None
        skipped = scaler.unscale_and_check(self.grad_shards, self.world, self.device) if scaler is not None else False
        grad_norm = None
        if not skipped and clip_grad > 0:
            # A segment left out of the norm must still be clipped with the others: measure, then scale the whole
            # shard (the coefficient of csrc/amp/grad_clip.cpp), as Engine._clip does.
            measure_only = bool(self._not_counted)
            grad_norm = clip_grad_norm(self._split, self._replicated, 0.0 if measure_only else clip_grad,
                                       self.groups.mp, self.clip_group, self.device)
            if measure_only and math.isfinite(grad_norm) and grad_norm > clip_grad:
                torch._foreach_mul_(self.grad_shards, clip_grad / (grad_norm + 1e-6))
        if not skipped:
            if self.fused:
                lr = float(self.optimizer.param_groups[0]["lr"])
                self._publish(lambda b: _C.sgd_step_and_cast([self.masters[b]], [self.grad_shards[b]],
                                                             [self.param_shards[b]], lr))
            else:
                # torch's step is one multi-tensor pass over every shard; each bucket's cast then launches its gather
                self.optimizer.step()
                if self.half_weights:
                    self._publish(lambda b: self.param_shards[b].copy_(self.masters[b].detach()))
                else:
                    self._publish(lambda b: None)  # the masters are the parameter shards: already written
        return None, skipped, grad_norm

    def _publish(self, write_shard) -> None:
        """Bucket by bucket in the next forward's order: write this rank's parameter shard, launch its all-gather
        (stage 3: the shard only; the next step gathers it). Without overlap, wait for them all here (the gathers
        then sit exposed at the end of the step)."""
        for b in self.launch_order:
            write_shard(b)
            if self.params is None:
                self.gather.launch(b)
        if not self.overlap:
            self.gather.wait_all()
