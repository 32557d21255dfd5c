"""Ring attention over the context-parallel group (Liu et al. 2023; the zigzag form of torchtitan and Megatron's
`p2p`): each rank keeps its queries, and the ranks' key/value blocks travel around the ring, one hop per step,
the next block's transfer in flight while the current block's attention runs.

With the head-tail split (chunks.py) rank r holds global chunks (r, 2 cp - 1 - r), and the block from rank src
needs only one attention call per step (its causal structure by global chunk position):

    src == r   the rank's own block: causal over its local order (its tokens are in increasing order)
    src <  r   every local query against the block's first chunk (src < r): full; its second chunk is later
    src >  r   the local second chunk's queries (2 cp - 1 - r) against the whole block: full; the first is earlier

Blocks fully in the future never run. The partial results merge by log-sum-exp (block_attention.merge). The
backward sends the blocks around the ring the other way, each with its dK/dV accumulator one hop behind, so every
rank adds its contribution to the block it holds and the accumulators arrive home after the last hop. Only the
kv heads travel (grouped-query attention expands them per block).
"""
from __future__ import annotations

import torch

from .block_attention import block_backward, block_forward, merge, merge_start
from .comm import RingComm

__all__ = ["RingAttention", "ring_attention"]

KV_TAG, GRAD_TAG = 1, 2


def _block(rank: int, src: int, half: int):
    """(query rows, key columns, causal) of the block from rank src, as slices of the local tensors."""
    everything = slice(None)
    if src == rank:
        return everything, everything, True
    if src < rank:
        return everything, slice(0, half), False
    return slice(half, None), everything, False


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm: RingComm, scale: float, backend: str):
        half = q.shape[2] // 2
        out, lse = merge_start(q)
        kv = torch.stack([k, v])
        for step in range(comm.size):
            pending = comm.shift(kv, +1, KV_TAG, step) if step + 1 < comm.size else None
            rows, cols, causal = _block(comm.rank, comm.source(step, +1), half)
            block_out, block_lse = block_forward(q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], causal,
                                                 scale, backend)
            merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse, first=step == 0)  # step 0: every row
            if pending is not None:
                kv = pending.wait()
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.scale, ctx.backend = comm, scale, backend
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm, scale, backend = ctx.comm, ctx.scale, ctx.backend
        half = q.shape[2] // 2
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        grads_in = None  # the accumulator of the block now held, on its way from the previous holder
        for step in range(comm.size):
            pending = comm.shift(kv, -1, KV_TAG, step) if step + 1 < comm.size else None
            rows, cols, causal = _block(comm.rank, comm.source(step, -1), half)
            bq, bk, bv = block_backward(dout[:, :, rows], q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols],
                                        out[:, :, rows], lse[:, :, rows], causal, scale, backend)
            dq[:, :, rows].add_(bq)  # fp32 accumulators take the blocks' gradients in their own dtype
            grads = (torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device) if grads_in is None
                     else grads_in.wait())
            grads[0][:, :, cols].add_(bk)
            grads[1][:, :, cols].add_(bv)
            grads_in = comm.shift(grads, -1, GRAD_TAG, step)  # on with the block; the last hop takes it home
            if pending is not None:
                kv = pending.wait()
        grads = grads_in.wait()
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: RingComm, scale: float,
                   backend: str) -> torch.Tensor:
    """Causal attention of this rank's queries against the whole sequence's keys: q [b, heads, s, d], k and v
    [b, kv_heads, s, d], s this rank's tokens (two chunks) -> [b, heads, s, d]."""
    if comm.size == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=q.shape[1] != k.shape[1])
    return RingAttention.apply(q, k, v, comm, scale, backend)


