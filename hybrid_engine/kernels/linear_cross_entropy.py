"""The LM head and the next-token cross-entropy in one, chunk by chunk over the tokens, so the full fp32 logits
[tokens, V'/p] never exist (Liger-Kernel's FusedLinearCrossEntropy: Hsu et al. 2024): for each chunk of rows the
logits are computed (in the weights' dtype), their vocab-parallel cross-entropy taken (the max and the sum of exp
all-reduced over MP, as parallel/tensor/vocab_cross_entropy.py does for whole logits; padding columns at or past
the vocabulary never count), and, when a gradient is wanted, the chunk's logit gradient (softmax - onehot) /
tokens turned at once into its share of the input's gradient. The logits of one chunk are all that is alive at a
time. The three passes over a chunk's logits (its maximum, its two sums, its gradient) are compiled regions on
CUDA with Triton.

The head's weight gradient is one GEMM over all the tokens where it can be: the chunks' logit gradients (half) are
kept for the backward, which multiplies them by the input at once. Summed chunk by chunk instead, every chunk's
GEMM would read and write the whole fp32 [V'/p, h] accumulator, which at a 128k vocabulary costs more than the
GEMM's arithmetic (an H200 profile of the 8B's head: 1.6 ms a chunk against 0.7 of arithmetic). The kept
gradients take 2 bytes a vocabulary entry a token; where that is more than the accumulator's 4 bytes a weight
(more than twice `hidden` tokens: `keeps_logit_grads`), the accumulator is used instead, so the loss never holds
more than it would.

Under MP the head's input enters the MP region before the loss (`LinearCrossEntropyHead`: Megatron's f, or the
all-gather along the sequence under SP): each rank's input gradient covers its vocabulary slice, and f's
backward sums them. `LinearCrossEntropy` is the loss as a value the engine takes; the engine binds it to the head
of its last stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from hybrid_engine.parallel.tensor import ops

from .options import region
from hybrid_engine.parallel.tensor.layers import _rank_and_size

__all__ = ["linear_cross_entropy", "LinearCrossEntropyHead", "LinearCrossEntropy", "CHUNK_BYTES"]

CHUNK_BYTES = 256 * 2**20  # a chunk's rows: as many as 256 MiB of fp32 logits hold (2048 of a 32k vocabulary)


def chunk_max(logits: torch.Tensor, valid: int) -> torch.Tensor:
    """Each row's largest logit over the first `valid` columns (the rest are padding), in fp32."""
    return logits[:, :valid].float().amax(dim=1)


def chunk_sums(logits: torch.Tensor, top: torch.Tensor, local: torch.Tensor, in_range: torch.Tensor,
               valid: int) -> torch.Tensor:
    """[2, rows]: the sum of exp(logit - top) over the valid columns, and the target's logit - top where this
    rank's columns hold the target (0 elsewhere): the two sums all-reduced over MP."""
    sum_exp = (logits[:, :valid].float() - top.unsqueeze(1)).exp().sum(dim=1)
    picked = logits.gather(1, local.unsqueeze(1)).squeeze(1).float() - top
    return torch.stack([sum_exp, torch.where(in_range, picked, torch.zeros_like(picked))])


def chunk_grad(logits: torch.Tensor, top: torch.Tensor, sum_exp: torch.Tensor, local: torch.Tensor,
               in_range: torch.Tensor, valid: int, tokens: int) -> torch.Tensor:
    """The logits' gradient of the mean loss, (softmax - onehot) / tokens, in the logits' dtype; padding columns 0."""
    cols = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    softmax = (logits.float() - top.unsqueeze(1)).exp() / sum_exp.unsqueeze(1)
    softmax = torch.where(cols < valid, softmax, torch.zeros_like(softmax))
    onehot = ((cols == local.unsqueeze(1)) & in_range.unsqueeze(1)).float()
    return ((softmax - onehot) / tokens).to(logits.dtype)


def add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, acc in fp32 and a, b in the weights' dtype. On CUDA with half a and b, one GEMM adds its fp32
    product into acc (cuBLAS's beta = 1 with an fp32 output): the vocabulary-sized weight gradient of every chunk is
    read and written once, not written in half, copied to fp32 and added. Elsewhere the product is added in place,
    converted as it is read (no fp32 copy of it), which equals `acc += (a @ b).float()` bit for bit."""
    if acc.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(a @ b)


class ChunkRegions:
    """The three elementwise passes over a chunk's logits, each one region (kernels/options.py): on CUDA with
    Triton each reads the logits once in their own dtype and never writes an fp32 copy of them."""

    def __init__(self, compiled: bool = False):
        self.max, self.sums, self.grad = (region(f, compiled) for f in (chunk_max, chunk_sums, chunk_grad))


EAGER = ChunkRegions()


def keeps_logit_grads(tokens: int, hidden: int) -> bool:
    """Whether the loss keeps its chunks' logit gradients for one weight-gradient GEMM in the backward (2 bytes a
    vocabulary entry a token) rather than summing the weight gradient chunk by chunk into an fp32 accumulator
    (4 bytes a weight): where the kept gradients are no larger."""
    return tokens <= 2 * hidden


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, group, vocab_size, rows_per_chunk, want_grads, regions):
        rank, size = _rank_and_size(group)
        part, hidden = weight.shape
        start = rank * part
        valid = max(0, min(part, vocab_size - start))
        x2, t = x.reshape(-1, hidden), targets.reshape(-1)
        n = x2.shape[0]
        if t.numel() != n:
            raise ValueError(f"linear_cross_entropy: {n} rows of hidden states but {t.numel()} targets")
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        keep = want_grads and keeps_logit_grads(n, hidden)
        grad_x = torch.empty_like(x2) if want_grads else None
        kept = torch.empty((n, part), dtype=weight.dtype, device=weight.device) if keep else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_grads and not keep \
            else None
        for lo in range(0, n, rows_per_chunk):
            xc, tc = x2[lo:lo + rows_per_chunk], t[lo:lo + rows_per_chunk]
            logits = xc @ weight.t()  # the unfused head's GEMM, in the weights' dtype
            in_range = (tc >= start) & (tc < start + part)
            local = (tc - start).clamp(0, part - 1)
            top = regions.max(logits, valid)
            if size > 1:
                dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            stats = regions.sums(logits, top, local, in_range, valid)
            if size > 1:
                dist.all_reduce(stats, group=group)
            total += (stats[0].log() - stats[1]).sum()
            if want_grads:
                grad_logits = regions.grad(logits, top, stats[0], local, in_range, valid, n)
                grad_x[lo:lo + rows_per_chunk] = grad_logits @ weight
                if keep:
                    kept[lo:lo + rows_per_chunk] = grad_logits
                else:
                    add_product(grad_w, grad_logits.t(), xc)
        if want_grads:
            ctx.grad_x, ctx.grad_w, ctx.kept, ctx.x2 = grad_x, grad_w, kept, (x2.detach() if keep else None)
            ctx.shape, ctx.dtype = x.shape, weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad):
        # held as attributes, not saved tensors, so each is released as soon as it is used
        grad_x = ctx.grad_x.mul_(grad.to(ctx.grad_x.dtype)).view(ctx.shape)
        if ctx.kept is not None:  # one GEMM over every token, its fp32 sum rounded once to the weights' dtype
            grad_w = torch.mm(ctx.kept.t(), ctx.x2)
            ctx.kept = ctx.x2 = None
            grad_w.mul_(grad)
        else:
            grad_w = ctx.grad_w.mul_(grad).to(ctx.dtype)
        ctx.grad_x = ctx.grad_w = None
        return grad_x, grad_w, None, None, None, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         group: Optional[dist.ProcessGroup], vocab_size: int, chunk_bytes: int = CHUNK_BYTES,
                         regions: ChunkRegions = EAGER) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32 scalar) of the logits x @ weight.T, equal to
    `vocab_parallel_cross_entropy(x @ weight.T, targets, group, vocab_size)` without holding them: x [..., h]
    (in the MP region: the same on every rank of `group`), weight this rank's vocabulary rows [V'/p, h], targets
    int64 [...]. Every rank of `group` calls it (two all-reduces a chunk). regions: the chunk's passes (compiled
    ones on CUDA)."""
    rows = max(1, chunk_bytes // (4 * weight.shape[0]))
    want = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(x, weight, targets, group, vocab_size, rows, want, regions)


class LinearCrossEntropyHead(nn.Module):
    """An LM head whose logits the loss computes (LinearCrossEntropy): it holds the head's `weight` (this rank's
    vocabulary rows, its placement and tags kept) and passes its input into the MP region, the hidden states
    [b, s, h] being the stage's output."""

    parameters_read_after_forward = True  # by the loss: ZeRO-3 keeps the weight gathered until the backward

    def __init__(self, head: nn.Module):
        super().__init__()
        self.weight = head.weight
        self.mp_group = getattr(head, "mp_group", None)
        self.sequence_parallel = bool(getattr(head, "sequence_parallel", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return ops.gather_along_sequence(x, self.mp_group)
        return ops.copy_to_mp_region(x, self.mp_group)

    def extra_repr(self) -> str:
        return f"vocabulary rows {self.weight.shape[0]}, logits computed chunk by chunk in the loss"


@dataclass(frozen=True)
class LinearCrossEntropy:
    """The next-token cross-entropy of a model whose last stage ends in a LinearCrossEntropyHead (its output the
    hidden states): the loss computes the logits chunk by chunk (linear_cross_entropy). Bound by the engine to the
    head of this rank's last stage and its MP group (`bind`)."""

    vocab_size: int
    chunk_bytes: int = CHUNK_BYTES
    compiled: bool = False  # the chunk's passes as compiled regions (CUDA with Triton)

    @staticmethod
    def head_of(last_stage: Optional[nn.Module]) -> LinearCrossEntropyHead:
        heads = [m for m in last_stage.modules() if isinstance(m, LinearCrossEntropyHead)] if last_stage else []
        if len(heads) != 1:
            raise ValueError(f"LinearCrossEntropy: the last stage must end in one LinearCrossEntropyHead, found "
                             f"{len(heads)}")
        return heads[0]

    def logits(self, hidden: torch.Tensor, last_stage: nn.Module) -> torch.Tensor:
        """This rank's logits [..., V'/p] of the last stage's output (its hidden states in the MP region)."""
        return hidden @ self.head_of(last_stage).weight.t()

    def bind(self, groups, last_stage: Optional[nn.Module]):
        if last_stage is None:  # a rank without the last stage never computes the loss
            def no_loss_here(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                raise RuntimeError("LinearCrossEntropy: this rank holds no last stage")

            return no_loss_here
        head, group, vocab, chunk = self.head_of(last_stage), groups.mp, self.vocab_size, self.chunk_bytes
        regions = ChunkRegions(self.compiled)

        def fused_linear_ce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return linear_cross_entropy(output, head.weight, target, group, vocab, chunk, regions)

        return fused_linear_ce

    def describe(self) -> str:
        return (f"fused linear + vocab-parallel cross-entropy over {self.vocab_size} tokens (chunks of "
                f"{self.chunk_bytes >> 20} MiB of fp32 logits, gradients computed in the forward, through autograd)")
