"""What a transformer block asks of context parallelism: its tokens' global positions (RoPE, a position table)
and causal attention of its queries against the whole sequence, by the ring or by the all-gather of K/V.

Which of the two runs is the planner's rule (hybrid_engine/planner/context_comm.py choose_comm, given to this rank
by whoever builds it: the engine), and which kernel computes the blocks is block_attention.pick_backend's; both are
asked once per sequence share at the first block and said in one line by global rank 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from hybrid_engine.config.checks import CP_COMMS
from .all_gather import AllGatherAttention
from .block_attention import pick_backend
from .chunks import positions
from .comm import RingComm
from .ring import RingAttention

__all__ = ["CP_COMMS", "ContextParallel"]


@dataclass
class ContextParallel:
    """This rank's part in context parallelism. comm: the cp group; rule: (q, k, cp, kernel) -> the transfer variant's
    choice (its .name, ring or all-gather, and .why: planner/context_comm.comm_rule); kernel: the blocks' kernel as
    the user asked it (--cp-kernel: auto, cudnn or flash; block_attention.pick_backend); announce: print the
    choices (global rank 0)."""

    comm: RingComm
    rule: Callable
    kernel: str = "auto"
    announce: bool = False
    _chosen: dict = field(default_factory=dict, repr=False)
    _positions: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def of_group(group: dist.ProcessGroup, ranks: list[int], rule: Callable, trace=None,
                 kernel: str = "auto") -> "ContextParallel":
        """ranks: the group's global ranks by cp coordinate; trace: the engine's _C.CommTrace (None: untraced)."""
        rank = ranks.index(dist.get_rank())
        return ContextParallel(RingComm(group, rank, len(ranks), ranks, trace), rule, kernel, dist.get_rank() == 0)

    @property
    def size(self) -> int:
        return self.comm.size

    def positions(self, local_tokens: int, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's `local_tokens` tokens."""
        key = (local_tokens, str(device))
        if key not in self._positions:
            self._positions[key] = positions(local_tokens * self.size, self.comm.rank, self.size, device)
        return self._positions[key]

    def choice(self, q: torch.Tensor, k: torch.Tensor) -> tuple[str, str]:
        """(ring | all-gather, the blocks' kernel) for attention of these shapes, decided (and said) once per
        sequence share."""
        local_tokens = q.shape[2]
        if local_tokens not in self._chosen:
            backend, why = pick_backend(q, k, self.kernel)
            chosen = self.rule(q, k, self.size, backend)
            self._chosen[local_tokens] = chosen.name, backend
            if self.announce:
                print(f"context parallel: cp {self.size}, {local_tokens} tokens per rank, {chosen.name} attention "
                      f"({chosen.why}); blocks by the {backend} kernel ({why})", flush=True)
        return self._chosen[local_tokens]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over the whole sequence: q [b, heads, s, d], k and v [b, kv_heads, s, d] of this rank's
        s tokens -> [b, heads, s, d]."""
        comm, backend = self.choice(q, k)
        fn = RingAttention if comm == "ring" else AllGatherAttention
        return fn.apply(q.contiguous(), k.contiguous(), v.contiguous(), self.comm, 1.0 / math.sqrt(q.shape[-1]),
                        backend)
