"""The vocab-parallel cross-entropy (Megatron-LM): the loss of logits split along the vocabulary over MP, computed
without gathering them (parallel/tensor/vocab_parallel.py's vocab_parallel_head produces such logits; models/losses.py's
VocabParallelCrossEntropy is this loss as a value the engine takes).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .layers import _rank_and_size

class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits split along the vocabulary, computed in fp32 without gathering them.

    Forward: global max (all-reduce MAX), then one all-reduce SUM of (sum of exp, target logit) -- the target
    logit comes from the rank whose slice holds it, zero elsewhere. Columns at or past `vocab_size` (padding)
    are -inf: they add nothing to the sum and get no gradient. Backward: (softmax - onehot) / tokens on the local
    slice, no communication. The saved softmax is turned into the gradient in place: backward runs once.
    """

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_size):
        rank, size = _rank_and_size(group)
        part = logits.shape[-1]
        start = rank * part
        x = logits.reshape(-1, part).float()
        valid = max(0, min(part, vocab_size - start))
        if valid < part:
            x = x.clone() if x.data_ptr() == logits.data_ptr() else x
            x[:, valid:] = float("-inf")
        t = targets.reshape(-1)
        if t.numel() != x.shape[0]:
            raise ValueError(f"vocab_parallel_cross_entropy: {x.shape[0]} logit rows but {t.numel()} targets")
        top = x.max(dim=1).values
        if size > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        x = x - top.unsqueeze(1)  # a new tensor: the logits are never written
        in_range = (t >= start) & (t < start + part)
        local = (t - start).clamp_(0, part - 1)
        picked = torch.where(in_range, x.gather(1, local.unsqueeze(1)).squeeze(1), torch.zeros_like(top))
        x.exp_()
        stats = torch.stack([x.sum(dim=1), picked])
        if size > 1:
            dist.all_reduce(stats, group=group)
        sum_exp, target_logit = stats[0], stats[1]
        x.div_(sum_exp.unsqueeze(1))  # the softmax, this rank's columns
        ctx.save_for_backward(x, local, in_range)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return (sum_exp.log() - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, in_range = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        softmax[rows, local] -= in_range.to(softmax.dtype)
        softmax.mul_(grad / softmax.shape[0])
        return softmax.view(ctx.shape).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 mp_group: Optional[dist.ProcessGroup], vocab_size: int) -> torch.Tensor:
    """Mean next-token cross-entropy over all tokens (fp32 scalar), equal to
    `F.cross_entropy(full_logits[..., :vocab_size].reshape(-1, V), targets.reshape(-1))`.

    logits: this rank's contiguous vocabulary slice [..., V'/p] (vocab_parallel_head's output; with mp 1 the full
    logits); targets: int64 [...] with ids < vocab_size. Every rank of `mp_group` must call it (two all-reduces).
    """
    return _VocabParallelCrossEntropy.apply(logits, targets, mp_group, vocab_size)
