"""Vocabulary-parallel tables (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053): a token
embedding or an LM head split along the vocabulary over MP. Rank r holds rows [r V'/p, (r+1) V'/p) of the table,
V' the vocabulary padded to a multiple of mp; the padding rows are zero and never reach the loss
(vocab_cross_entropy.py excludes their logits), so they stay zero under SGD and Adam(W). A token table is split
by `split_table` and read through `VocabParallelLookup`; an LM head is `vocab_parallel_head`, a column-parallel
linear whose logits stay split.

The split table carries `mp_full_size = V`, so `layers.gather_full` returns the unpadded [V, h] table and
`layers.take_shard` pads it back: checkpoints hold the same tensor on every grid.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybrid_engine.parallel.tensor import ops

from .layers import ColumnParallelLinear, _mark, _rank_and_size
from .sequence_parallel import _check_divisible, reduce_scatter_along_sequence


def padded_vocab_size(vocab_size: int, mp_size: int) -> int:
    """The vocabulary rounded up to a multiple of mp (the extra rows are padding that never reaches the loss)."""
    return -(-vocab_size // mp_size) * mp_size


def pad_rows(full: torch.Tensor, rows: int) -> torch.Tensor:
    """`full` with zero rows appended up to `rows` (the padded vocabulary)."""
    if full.shape[0] == rows:
        return full
    return torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])


def mark_vocab_split(param: torch.nn.Parameter, mp_size: int, vocab_size: int) -> None:
    """Placement of a vocabulary-split table: split along dim 0, its full length the unpadded vocabulary."""
    _mark(param, mp_size > 1, dim=0)
    if mp_size > 1:
        param.mp_full_size = vocab_size


def vocab_parallel_lookup(tokens: torch.Tensor, table: torch.Tensor, vocab_start: int,
                          mp_group: Optional[dist.ProcessGroup], mp_size: int,
                          sequence_parallel: bool = False) -> torch.Tensor:
    """tokens [b, s] -> their rows of the table [b, s, h], each looked up by the rank whose slice holds it (zeros
    elsewhere) and summed over MP (the paper's g: exact in any precision, one term is nonzero); under sequence
    parallelism reduce-scattered instead, giving this rank's chunk [b, s/p, h]. table: this rank's rows,
    starting at vocabulary id `vocab_start`; with mp 1 the whole table."""
    if mp_size == 1:
        return F.embedding(tokens, table)
    local = tokens - vocab_start
    outside = (local < 0) | (local >= table.shape[0])
    rows = F.embedding(local.masked_fill(outside, 0), table).masked_fill(outside.unsqueeze(-1), 0.0)
    if not sequence_parallel:
        return ops.reduce_from_mp_region(rows, mp_group)
    _check_divisible(tokens.shape[1], mp_size)
    return reduce_scatter_along_sequence(rows, mp_group)


@torch.no_grad()
def split_table(table: torch.Tensor, group: Optional[dist.ProcessGroup]) -> nn.Parameter:
    """This rank's rows of a full table [V, h] over the padded vocabulary, placed (mark_vocab_split)."""
    rank, size = _rank_and_size(group)
    vocab = table.shape[0]
    rows = padded_vocab_size(vocab, size) // size
    part = nn.Parameter(pad_rows(table.detach(), rows * size)[rank * rows : (rank + 1) * rows].clone(),
                        requires_grad=table.requires_grad)
    mark_vocab_split(part, size, vocab)
    return part


class VocabParallelLookup(nn.Module):
    """lookup(tokens, table): the rows of a token table split along the vocabulary (vocab_parallel_lookup), this
    rank's rows starting at rank x rows; under sequence parallelism this rank's sequence chunk."""

    def __init__(self, group: Optional[dist.ProcessGroup], sequence_parallel: bool = False):
        super().__init__()
        self.mp_group = group
        self.mp_rank, self.mp_size = _rank_and_size(group)
        self.sequence_parallel = sequence_parallel and self.mp_size > 1

    def forward(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_lookup(tokens, table, self.mp_rank * table.shape[0], self.mp_group, self.mp_size,
                                     self.sequence_parallel)

    def extra_repr(self) -> str:
        return f"rank {self.mp_rank} of {self.mp_size}, sequence_parallel={self.sequence_parallel}"


def vocab_parallel_head(linear: nn.Module, group: Optional[dist.ProcessGroup],
                        sequence_parallel: bool = False) -> ColumnParallelLinear:
    """An LM head (a full [V, h] weight, no bias) as a column-parallel linear over the padded vocabulary: this
    rank's logits [b, s, V'/p], never gathered (vocab_cross_entropy.py's loss takes them as they are)."""
    weight = linear.weight
    head = ColumnParallelLinear(weight.shape[1], padded_vocab_size(weight.shape[0], _rank_and_size(group)[1]),
                                group, bias=False, sequence_parallel=sequence_parallel, device=weight.device,
                                dtype=weight.dtype, init=False)
    head.weight = split_table(weight, group)
    return head
