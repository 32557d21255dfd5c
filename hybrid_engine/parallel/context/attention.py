"""What a transformer block asks of context parallelism: its tokens' global positions (RoPE, a position table)
and causal attention of its queries against the whole sequence, by the ring or by the all-gather of K/V.

Which of the two runs is one rule (`choose_comm`), said once by global rank 0 when the first block asks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hybrid_engine.config.checks import CP_COMMS
from .all_gather import AllGatherAttention
from .block_attention import pick_backend
from .chunks import positions
from .comm import RingComm
from .ring import RingAttention

__all__ = ["CP_COMMS", "RING_MIN_TOKENS", "choose_comm", "ContextParallel"]

# Tokens per rank from which the ring's hops hide under the attention of a block (the work of a block grows with
# the square of its tokens, a hop's bytes linearly); below it, one all-gather costs less than cp - 1 exposed hops.
RING_MIN_TOKENS = 4096


def choose_comm(asked: str, tokens_per_rank: int, cp: int) -> tuple[str, str]:
    """(ring | all-gather, the reason in words)."""
    if asked != "auto":
        return asked, "--cp-comm"
    if cp > 2 and tokens_per_rank >= RING_MIN_TOKENS:
        return "ring", (f"auto: {tokens_per_rank} tokens per rank >= {RING_MIN_TOKENS} and cp {cp} > 2, so each "
                        "K/V hop hides under a block's attention")
    return "all-gather", (f"auto: {tokens_per_rank} tokens per rank < {RING_MIN_TOKENS} or cp {cp} <= 2, so one "
                          "K/V all-gather costs less than the ring's cp - 1 hops (--cp-comm ring to force)")


@dataclass
class ContextParallel:
    """This rank's part in context parallelism. comm: the cp group; asked: --cp-comm; announce: print the choice
    (global rank 0)."""

    comm: RingComm
    asked: str = "auto"
    announce: bool = False
    _chosen: dict = field(default_factory=dict, repr=False)
    _positions: dict = field(default_factory=dict, repr=False)

    @staticmethod
    def of_group(group: dist.ProcessGroup, ranks: list[int], asked: str = "auto", trace=None) -> "ContextParallel":
        """ranks: the group's global ranks by cp coordinate; trace: the engine's _C.CommTrace (None: untraced)."""
        rank = ranks.index(dist.get_rank())
        return ContextParallel(RingComm(group, rank, len(ranks), ranks, trace), asked, dist.get_rank() == 0)

    @property
    def size(self) -> int:
        return self.comm.size

    def positions(self, local_tokens: int, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's `local_tokens` tokens."""
        key = (local_tokens, str(device))
        if key not in self._positions:
            self._positions[key] = positions(local_tokens * self.size, self.comm.rank, self.size, device)
        return self._positions[key]

    def choice(self, local_tokens: int) -> str:
        if local_tokens not in self._chosen:
            chosen, why = choose_comm(self.asked, local_tokens, self.size)
            self._chosen[local_tokens] = chosen
            if self.announce:
                print(f"context parallel: cp {self.size}, {local_tokens} tokens per rank, {chosen} attention ({why})",
                      flush=True)
        return self._chosen[local_tokens]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over the whole sequence: q [b, heads, s, d], k and v [b, kv_heads, s, d] of this rank's
        s tokens -> [b, heads, s, d]."""
        fn = RingAttention if self.choice(q.shape[2]) == "ring" else AllGatherAttention
        backend = pick_backend(q.device, q.dtype)
        return fn.apply(q.contiguous(), k.contiguous(), v.contiguous(), self.comm, 1.0 / math.sqrt(q.shape[-1]),
                        backend)
