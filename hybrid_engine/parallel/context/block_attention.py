"""One block of attention -- queries against one block of keys and values -- that also returns the rows'
log-sum-exp, so that blocks computed apart merge exactly (`merge`); and its backward, given the merged output and
log-sum-exp (the rows' softmax over every block, which is what each block's gradient needs).

Layouts: q [b, heads, sq, d], k and v [b, kv_heads, sk, d] (grouped-query attention: each kv head serves
heads / kv_heads consecutive query heads, expanded here, after the K/V travelled), out [b, heads, sq, d] and lse
[b, heads, sq] in fp32. `causal` masks key j from query i when j > i (square diagonal blocks only).

Backends, one code path each way:
    flash      CUDA, fp16/bf16: aten's flash-attention kernel and its backward (what SDPA runs)
    cpu-flash  CPU: aten's flash-attention-for-CPU kernel and its backward
    math       anywhere, any dtype: the softmax written out in fp32 (CUDA fp32, which flash does not take)
"""
from __future__ import annotations

import torch

__all__ = ["BACKENDS", "pick_backend", "block_forward", "block_backward", "merge_start", "merge"]

BACKENDS = ("flash", "cpu-flash", "math")


def pick_backend(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel for blocks of this device and dtype."""
    if device.type == "cuda":
        return "flash" if dtype in (torch.float16, torch.bfloat16) else "math"
    return "cpu-flash" if device.type == "cpu" else "math"


def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // kv.shape[1]
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def _fold(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of expanded kv heads summed back onto the kv heads."""
    b, heads, s, d = grad.shape
    return grad if heads == kv_heads else grad.view(b, kv_heads, heads // kv_heads, s, d).sum(2)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in q's dtype, lse fp32) of q against one block of k, v."""
    heads = q.shape[1]
    k, v = _expand(k, heads), _expand(v, heads)
    if backend == "flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, lse.float()
    if backend == "cpu-flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse.float()
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float())
    return out.to(q.dtype), lse


def block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, causal: bool, scale: float,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one block, dk and dv on the kv heads; out and lse are the rows' merged ones."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = _expand(k, heads), _expand(v, heads)
    if backend == "flash":
        # Dense batches have no cumulative sequence lengths (the forward returns None for them), and without
        # dropout the kernel reads no RNG state: placeholders of the forward's shapes stand in for it.
        seed = torch.empty(2, device=q.device, dtype=torch.uint64)
        offset = torch.empty((), device=q.device, dtype=torch.uint64)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, q.shape[2], k.shape[2], 0.0, causal, seed, offset,
            scale=scale)
    elif backend == "cpu-flash":
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), 0.0, causal, scale=scale)
    else:
        p = torch.exp(_scores(q, k, causal, scale) - lse.unsqueeze(-1))
        dout32 = dout.float()
        dv = torch.matmul(p.transpose(-1, -2), dout32)
        dp = torch.matmul(dout32, v.float().transpose(-1, -2))
        ds = p * (dp - (dout32 * out.float()).sum(-1, keepdim=True))
        dq = torch.matmul(ds, k.float()) * scale
        dk = torch.matmul(ds.transpose(-1, -2), q.float()) * scale
    return dq, _fold(dk, kv_heads), _fold(dv, kv_heads)


def merge_start(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The running fp32 (out, lse) of q's rows, unwritten: each row's first block writes it (`merge(first=True)`),
    and every row has one (its own chunk's causal diagonal)."""
    return (torch.empty(q.shape, dtype=torch.float32, device=q.device),
            torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))


def merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor,
          first: bool = False) -> None:
    """Fold one block's (out, lse) into the running fp32 (out, lse) of the same rows, in place: each side
    weighted by its share exp(lse_side - lse_both) of the rows' softmax mass; the rows' first block is copied.
    Two passes over the output (a scale, then a multiply-add that reads the block in its own dtype): the merges are
    a ring step's memory traffic beside its attention."""
    if first:
        out.copy_(block_out)
        lse.copy_(block_lse)
        return
    both = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - both).unsqueeze(-1)).addcmul_(block_out, torch.exp(block_lse - both).unsqueeze(-1))
    lse.copy_(both)
