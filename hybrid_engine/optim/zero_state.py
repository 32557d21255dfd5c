"""The distributed optimizer's state in the grid-independent form checkpoints hold, and back: each bucket's shards
of masters and optimizer state gathered over the shard group and cut into full tensors by parameter name (gathered
over MP too), and full tensors sliced to this rank's MP shard, laid out in the buckets and cut to its shard. Any
zero level, grid and world size reads what any other wrote (hybrid_engine/checkpoint/engine_state.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from hybrid_engine.parallel.tensor.layers import copy_placement, gather_full, take_shard


class ShardedState:
    """Mixed into ShardedOptimizer: reads its layout, shards, masters, optimizer and shard groups."""

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

    def _full(self, shard: torch.Tensor) -> torch.Tensor:
        """A bucket-sized tensor from every DP rank's shard (all of them must call)."""
        if self.dp_size == 1:
            return shard.detach().clone()
        pieces = [torch.empty_like(shard) for _ in range(self.dp_size)]
        dist.all_gather(pieces, shard.detach().contiguous(), group=self.shard_groups.shard)
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
        parameter buffers are about to be overwritten; stage 3's are released, its pieces written)."""
        self.gather.wait_all()
        if self.params is not None:
            self.params.release_all()
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
            if self.params is None:
                self.param_flats[b].copy_(master)
            else:
                self.param_shards[b].copy_(master[start:end])
            self.masters[b].copy_(master[start:end])
            self._set_bucket_state(b, {k: v[start:end] if torch.is_tensor(v) and v.dim() > 0 else v
                                       for k, v in keys.items()})
