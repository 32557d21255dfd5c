"""One block of attention -- queries against one block of keys and values -- that also returns the rows'
log-sum-exp, so that blocks computed apart merge exactly (`merge`); and its backward, given the merged output and
log-sum-exp (the rows' softmax over every block, which is what each block's gradient needs).

Layouts: q [b, heads, sq, d], k and v [b, kv_heads, sk, d] (grouped-query attention: each kv head serves
heads / kv_heads consecutive query heads; cuDNN takes them as they are, the other kernels expanded here, after the
K/V travelled), out [b, heads, sq, d] and lse [b, heads, sq] in fp32. `causal` masks key j from query i when
j > i (square diagonal blocks only).

Backends, one code path each way:
    cudnn      CUDA, fp16/bf16: aten's cuDNN attention and its backward (what SDPA runs on Hopper), the kv heads
               taken as they are
    flash      CUDA, fp16/bf16: aten's flash-attention kernel and its backward
    cpu-flash  CPU: aten's flash-attention-for-CPU kernel and its backward
    math       anywhere, any dtype: the softmax written out in fp32 (CUDA fp32, which neither CUDA kernel takes)

A block runs the kernel torch's own SDPA picks for it on this device (`pick_backend`): on an H200 SDPA's cuDNN
kernels ran the blocks of cp 4 at 32k tokens 1.6x faster than aten's flash kernel, forward and backward together
(experiments/bench/attention_kernels_bench.py), so blocks called through flash cost context parallelism a third of
its attention time beside one GPU's single SDPA call.
"""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

__all__ = ["BACKENDS", "pick_backend", "block_forward", "block_backward", "merge_start", "merge"]

BACKENDS = ("cudnn", "flash", "cpu-flash", "math")


def pick_backend(q: torch.Tensor, k: torch.Tensor, asked: str = "auto") -> tuple[str, str]:
    """(the kernel for blocks of q [b, heads, s, d] against k [b, kv_heads, s', d], why in words). asked: the
    user's --cp-kernel (cudnn or flash: that kernel on CUDA; auto: the one torch's SDPA picks for these shapes,
    cuDNN's where it picks cuDNN, else flash). Without a CUDA half-precision tensor the blocks run the one kernel
    that takes them."""
    if q.device.type != "cuda":
        return ("cpu-flash", "the CPU's") if q.device.type == "cpu" else ("math", f"on {q.device.type}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        return "math", f"{q.dtype} (the CUDA kernels take fp16 and bf16)"
    if asked != "auto":
        return asked, "--cp-kernel"
    chosen = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    if chosen == SDPBackend.CUDNN_ATTENTION.value:
        return "cudnn", "auto: the kernel torch's SDPA runs for these shapes here"
    return "flash", "auto: torch's SDPA does not pick cuDNN for these shapes here"


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
    if backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), None, True, 0.0, causal, False, scale=scale)[:2]
        return out, lse.squeeze(-1)  # cuDNN's [b, heads, s, 1]
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
    if backend == "cudnn":
        # Dense: no cumulative sequence lengths (given, they would mean packed sequences), no bias; without
        # dropout the RNG state is not read. A half block's rows and columns are handed over as contiguous
        # copies, as in the forward.
        unused = torch.empty(0, device=q.device)
        dout, q, k, v, out = (t.contiguous() for t in (dout, q, k, v, out))
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1).contiguous(), unused, unused, None, None, None, q.shape[2],
            k.shape[2], 0.0, causal, scale=scale)
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
