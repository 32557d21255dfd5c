"""The head-tail (zigzag) split of a sequence over the context-parallel ranks.

A sequence of S tokens is cut into 2 cp chunks of S / (2 cp); rank r holds chunk r and its mirror 2 cp - 1 - r,
side by side (chunk r first). Under causal attention a query attends to the keys before it, so the front chunks
are cheap and the back ones dear: pairing one of each gives every rank the same attention work (torchtitan's and
Megatron's load balancing). A rank's tokens stay in increasing global order, which the ring relies on.
"""
from __future__ import annotations

import torch

__all__ = ["check_sequence", "chunk_length", "positions", "local_chunks"]


def check_sequence(seq_len: int, cp: int, flag: str = "--seq-len") -> str | None:
    """The one line that refuses a sequence the split cannot cut evenly, or None."""
    if cp > 1 and seq_len % (2 * cp):
        return (f"{flag} {seq_len} is not divisible by 2 x --cp = {2 * cp}: context parallelism cuts each sequence "
                f"into 2 x cp equal chunks (rank r holds chunk r and chunk 2 cp - 1 - r)")
    return None


def chunk_length(seq_len: int, cp: int) -> int:
    """Tokens in one of the 2 cp chunks."""
    if seq_len % (2 * cp):
        raise ValueError(check_sequence(seq_len, cp))
    return seq_len // (2 * cp)


def positions(seq_len: int, rank: int, cp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The global positions (int64, increasing) of rank `rank`'s tokens: chunk r, then chunk 2 cp - 1 - r."""
    c = chunk_length(seq_len, cp)
    head = torch.arange(rank * c, (rank + 1) * c, device=device)
    tail = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([head, tail])


def local_chunks(tokens: torch.Tensor, rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s part of full sequences along `dim` (inputs, targets, or any per-token tensor)."""
    if cp == 1:
        return tokens
    index = positions(tokens.shape[dim], rank, cp, tokens.device)
    return tokens.index_select(dim, index)
