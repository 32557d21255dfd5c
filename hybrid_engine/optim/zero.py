"""The distributed optimizer (ZeRO stage 1; Megatron's distributed optimizer): optimizer state sharded over DP.

Every gradient bucket is reduce-scattered instead of all-reduced (csrc/executor/dp_grad_sync.h, `shard`): DP rank r
then holds the summed gradient of the r-th equal piece of each bucket, and keeps fp32 masters and optimizer state
for that piece only. Parameters live in flat buffers laid out exactly like the gradient buckets, so a bucket's
shard of gradients, of masters and of parameters cover the same elements. The step updates the shard and
all-gathers each parameter buffer over DP, so every replica holds the whole updated model again: bucket by bucket,
each gather launched as soon as its shard is written and waited for only by the next forward's first layer that
reads it (hybrid_engine/parallel/data_parallel/param_gather.py; `overlap=False` waits for them all at the end of the step instead).

The optimizer sees one flat tensor per bucket shard, so it must be elementwise (SGD, Adam, AdamW: what Megatron's
distributed optimizer supports); a shard may cut a parameter anywhere. Decisions that need the whole gradient are
agreed over the ranks that hold its pieces: the fp16 overflow flag over the world (DP too, since no rank sees all
gradients), the clipping norm summed over DP as well as PP and MP (MP-replicated parameters counted once).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

import hybrid_engine._C as _C
from . import optimizers as optim
from hybrid_engine.optim.scaling import clip_grad_norm
from hybrid_engine.parallel.data_parallel.grad_buffer import BufferLayout
from hybrid_engine.parallel.data_parallel.param_gather import ForwardWaits
from hybrid_engine.parallel.tensor.layers import copy_placement, gather_full, is_mp_split, take_shard


def clip_group_for_shards(groups, clip_grad: float) -> dist.ProcessGroup | None:
    """ZeRO-1 clipping sums squared norms over DP as well as PP: the group of every (dp, pp) with this rank's mp
    coordinate. dist.new_group is collective over the world, so every rank creates every such group."""
    if clip_grad <= 0 or not dist.is_initialized():
        return None
    grid, mine = groups.grid, None
    for m in range(grid.mp_size):
        group = dist.new_group([r for r in range(grid.world_size) if grid.coords(r).mp == m])
        if groups.coords.mp == m:
            mine = group
    return mine


class ShardedOptimizer:
    """ZeRO-1 over the engine's gradient buffer: the optimizer of this DP rank's shard, and the step."""

    fuses_unscale = False

    def __init__(self, factory: optim.OptimizerFactory, layout: BufferLayout, half_weights: bool, groups,
                 clip_group: dist.ProcessGroup | None, device: torch.device, stages: dict[int, nn.Sequential],
                 overlap: bool = True, comm_trace: _C.CommTrace | None = None,
                 not_counted: set[int] = frozenset()):
        self.layout, self.groups, self.device = layout, groups, device
        # Shards over every copy of the weights, dp x cp (the dp group itself while cp = 1), by group rank.
        self.dp_rank = groups.coords.dp if groups.cp is None else dist.get_rank(group=groups.dp_cp)
        self.dp_size = groups.grid.dp_size * groups.grid.cp_size
        self.half_weights, self.clip_group = half_weights, clip_group
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
        self.grad_shards = [layout.grads.buckets[b][s:e] for b, (s, e) in enumerate(self.shards)]
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
        # The updated parameters go back to every replica through one in-place all-gather per bucket, launched in
        # the order the next forward reads the buckets; with overlap, each layer of that forward waits for its own.
        self.overlap = overlap
        self.gather = _C.DpParamGather(self.param_flats, groups.dp_cp, comm_trace)
        self.waits = ForwardWaits(self.gather, layout)
        self.launch_order = self.waits.launch_order(stages)

    def describe(self) -> str:
        how = "fused SGD + master -> half cast" if self.fused else "torch step"
        axes = "DP x CP" if self.groups.cp is not None else "DP"
        return (f"optimizer: {type(self.optimizer).__name__} sharded over {self.dp_size} {axes} ranks (ZeRO-1, {how}): "
                f"{(self.master_bytes() + optim.state_bytes(self.optimizer)) / 2**20:.1f} MiB of masters and "
                "optimizer state on this rank")

    def _norm_segments(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """This shard's gradient, cut at parameter boundaries: MP-split pieces and MP-replicated pieces."""
        split, replicated = [], []
        for b, (start, end) in enumerate(self.shards):
            for p, offset in self.layout.members[b]:
                lo, hi = max(start, offset), min(end, offset + p.numel())
                if lo < hi and id(p) not in self._not_counted:
                    (split if is_mp_split(p) else replicated).append(self.layout.grads.buckets[b][lo:hi])
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

    def _bucket_state(self, b: int) -> dict:
        """The optimizer's state of bucket b's shard, its pieces' per-element tensors joined."""
        states = [self.optimizer.state.get(t, {}) for _, _, t in self.pieces[b]]
        if len(states) == 1 or not states[0]:
            return states[0]
        return {k: torch.cat([st[k] for st in states]) if torch.is_tensor(v) and v.dim() > 0 else v
                for k, v in states[0].items()}

    def _set_bucket_state(self, b: int, state: dict) -> None:
        for lo, hi, t in self.pieces[b]:
            if state:
                self.optimizer.state[t] = {k: (v[lo:hi].clone() if torch.is_tensor(v) and v.dim() > 0
                                               else (v.clone() if torch.is_tensor(v) else v)) for k, v in state.items()}
            else:
                self.optimizer.state.pop(t, None)

    def grad_shard_of(self, param: nn.Parameter) -> torch.Tensor:
        """This DP rank's shard of the gradient bucket that holds `param` alone (build_grad_buffer's `alone`)."""
        for b, members in enumerate(self.layout.members):
            if any(p is param for p, _ in members):
                if len(members) != 1:
                    raise RuntimeError("ZeRO-1: a tied copy must have a gradient bucket of its own")
                return self.grad_shards[b]
        raise KeyError("ZeRO-1: parameter not in this rank's gradient buckets")

    def master_bytes(self) -> int:
        """Bytes of this rank's fp32 master shards when they are copies (half weights; else 0: the parameter
        shards are their own masters)."""
        return sum(m.numel() * m.element_size() for m in self.masters) if self.half_weights else 0

    # ------------------------------------------------------------------------------------------------- step
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
        """Bucket by bucket in the next forward's order: write this rank's parameter shard, launch its all-gather.
        Without overlap, wait for them all here (the gathers then sit exposed at the end of the step)."""
        for b in self.launch_order:
            write_shard(b)
            self.gather.launch(b)
        if not self.overlap:
            self.gather.wait_all()

    # ------------------------------------------------------------------------------------------- checkpoints
    def _full(self, shard: torch.Tensor) -> torch.Tensor:
        """A bucket-sized tensor from every DP rank's shard (all of them must call)."""
        if self.dp_size == 1:
            return shard.detach().clone()
        pieces = [torch.empty_like(shard) for _ in range(self.dp_size)]
        dist.all_gather(pieces, shard.detach().contiguous(), group=self.groups.dp_cp)
        return torch.cat(pieces)

    def full_state(self, names: dict[int, str], with_optimizer: bool = True) -> tuple[dict, dict]:
        """(weights, optimizer) of this rank's parameters as full tensors keyed by global name, gathered over DP
        and MP (fp32 masters): the grid-independent form checkpoints hold. names: id(param) -> global name.
        Every rank of the DP and MP groups must call it."""
        weights, optimizer = {}, {}
        for b, members in enumerate(self.layout.members):
            master = self._full(self.masters[b])
            state = self._bucket_state(b) if with_optimizer else {}
            per_element = {k: self._full(v) for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0}
            for p, offset in members:
                name = names[id(p)]

                def piece(flat: torch.Tensor, p=p, offset=offset) -> torch.Tensor:
                    local = copy_placement(p, flat[offset : offset + p.numel()].view_as(p))
                    return gather_full(local, self.groups.mp).cpu()

                weights[name] = piece(master)
                optimizer[name] = {k: piece(per_element[k]) if k in per_element
                                   else (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                                   for k, v in state.items()}
        return weights, optimizer

    @torch.no_grad()
    def load_state(self, names: dict[int, str], weights: dict, optimizer: dict) -> None:
        """Inverse of full_state on any grid: full tensors sliced to this rank's MP shard, laid out in the
        buckets, then this DP rank's shard taken. No collectives (but in-flight gathers are finished: the
        parameter buffers are about to be overwritten)."""
        self.gather.wait_all()
        for b, members in enumerate(self.layout.members):
            master = torch.zeros(self.param_flats[b].numel(), dtype=torch.float32, device=self.device)
            keys = {}
            for p, offset in members:
                name = names[id(p)]
                master[offset : offset + p.numel()] = take_shard(weights[name], like=p, mp_group=self.groups.mp
                                                                 ).reshape(-1).to(master)
                for key, value in optimizer.get(name, {}).items():
                    if torch.is_tensor(value) and value.dim() > 0:
                        flat = keys.setdefault(key, torch.zeros_like(master))
                        flat[offset : offset + p.numel()] = take_shard(value, like=p, mp_group=self.groups.mp
                                                                       ).reshape(-1).to(flat)
                    else:
                        keys.setdefault(key, value)
            start, end = self.shards[b]
            self.param_flats[b].copy_(master)
            self.masters[b].copy_(master[start:end])
            self._set_bucket_state(b, {k: v[start:end] if torch.is_tensor(v) and v.dim() > 0 else v
                                       for k, v in keys.items()})
