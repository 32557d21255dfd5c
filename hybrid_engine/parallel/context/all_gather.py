"""All-gather attention over the context-parallel group (Megatron's `cp_comm_type all_gather`): every rank gathers
the whole sequence's K/V (kv heads only) in one collective and computes its own queries against it; the backward
gathers again (nothing cp-times larger is kept between forward and backward) and reduce-scatters dK/dV home.
One collective per direction instead of cp - 1 hops: better while the sequence per rank is short, where a hop's
latency would not hide under a block's attention.

Each local chunk (global index j, tokens [j c, (j + 1) c)) attends to the keys before it in full and to its own
chunk causally: two blocks, merged by log-sum-exp (block_attention.merge).
"""
from __future__ import annotations

import torch

from .block_attention import block_backward, block_forward, merge, merge_start
from .comm import RingComm

__all__ = ["AllGatherAttention"]


def _in_order(gathered: torch.Tensor) -> torch.Tensor:
    """[cp, 2, b, kv, 2c, d] by rank (each rank's chunks r and 2 cp - 1 - r) -> [2, b, kv, 2 cp c, d] in global
    order."""
    cp, half = gathered.shape[0], gathered.shape[4] // 2
    front = [gathered[r][..., :half, :] for r in range(cp)]
    back = [gathered[r][..., half:, :] for r in reversed(range(cp))]
    return torch.cat(front + back, dim=-2)


def _by_rank(full: torch.Tensor, cp: int) -> torch.Tensor:
    """Inverse of _in_order: [2, b, kv, S, d] -> [cp, 2, b, kv, S / cp, d]."""
    chunks = full.chunk(2 * cp, dim=-2)
    return torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]], dim=-2) for r in range(cp)])


def _blocks(rank: int, cp: int, half: int):
    """(local query rows, global key columns, causal, the rows' first block) of the two chunks' blocks."""
    for local, j in ((0, rank), (1, 2 * cp - 1 - rank)):
        rows = slice(local * half, (local + 1) * half)
        if j:
            yield rows, slice(0, j * half), False, True
        yield rows, slice(j * half, (j + 1) * half), True, not j


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm: RingComm, scale: float, backend: str):
        half = q.shape[2] // 2
        full = _in_order(comm.all_gather(torch.stack([k, v])))
        out, lse = merge_start(q)
        for rows, cols, causal, first in _blocks(comm.rank, comm.size, half):
            block_out, block_lse = block_forward(q[:, :, rows], full[0][:, :, cols], full[1][:, :, cols], causal,
                                                 scale, backend)
            merge(out[:, :, rows], lse[:, :, rows], block_out, block_lse, first)
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
        full = _in_order(comm.all_gather(torch.stack([k, v])))
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dfull = torch.zeros(full.shape, dtype=torch.float32, device=q.device)
        for rows, cols, causal, _ in _blocks(comm.rank, comm.size, half):
            bq, bk, bv = block_backward(dout[:, :, rows], q[:, :, rows], full[0][:, :, cols], full[1][:, :, cols],
                                        out[:, :, rows], lse[:, :, rows], causal, scale, backend)
            dq[:, :, rows].add_(bq)  # fp32 accumulators take the blocks' gradients in their own dtype
            dfull[0][:, :, cols].add_(bk)
            dfull[1][:, :, cols].add_(bv)
        mine = comm.reduce_scatter(_by_rank(dfull, comm.size))
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None, None, None
