"""The context-parallel blocks' CUDA kernels (parallel/context/block_attention.py) against fp32 attention on one GPU:
a query chunk attends to an earlier key chunk in full and to its own chunk causally, two blocks merged by their
log-sum-exp as the ring merges them, forward and backward (each block's gradient from the merged output and
log-sum-exp), grouped-query attention with the kv heads handed over unexpanded, for every CUDA kernel; and the
kernel `auto` picks is the one torch's own SDPA runs for the same shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybrid_engine.parallel.context.block_attention import (block_backward, block_forward, merge, merge_start,
                                                            pick_backend)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

B, HEADS, KV_HEADS, CHUNK = 2, 8, 2, 256


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
@pytest.mark.parametrize("d", [64, 128])
def test_two_merged_blocks_are_causal_attention_of_the_later_chunk(backend, d):
    gen = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(B, HEADS, 2 * CHUNK, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(B, KV_HEADS, 2 * CHUNK, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    dout = torch.randn(B, HEADS, CHUNK, d, device="cuda", generator=gen).bfloat16()
    scale = d ** -0.5

    # the reference: fp32 causal attention of the whole sequence, the later chunk's rows and their gradients
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)[:, :, CHUNK:]
    want.backward(dout.float())

    rows = q[:, :, CHUNK:]
    blocks = ((slice(0, CHUNK), False), (slice(CHUNK, None), True))  # the earlier chunk in full, its own causally
    out, lse = merge_start(rows)
    for i, (cols, causal) in enumerate(blocks):
        block_out, block_lse = block_forward(rows, k[:, :, cols], v[:, :, cols], causal, scale, backend)
        assert block_lse.shape == rows.shape[:3] and block_lse.dtype == torch.float32
        merge(out, lse, block_out, block_lse, first=i == 0)
    assert rel(out, want) < 2e-2, backend

    merged = out.to(q.dtype)
    dq = torch.zeros(rows.shape, device="cuda")
    dk, dv = torch.zeros(k.shape, device="cuda"), torch.zeros(v.shape, device="cuda")
    for cols, causal in blocks:
        bq, bk, bv = block_backward(dout, rows, k[:, :, cols], v[:, :, cols], merged, lse, causal, scale, backend)
        assert bk.shape == (B, KV_HEADS, CHUNK, d)  # on the kv heads
        dq += bq.float()
        dk[:, :, cols] += bk.float()
        dv[:, :, cols] += bv.float()
    assert rel(dq, qr.grad[:, :, CHUNK:]) < 3e-2, backend
    assert rel(dk, kr.grad) < 3e-2 and rel(dv, vr.grad) < 3e-2, backend


def test_auto_picks_the_kernel_torchs_sdpa_runs():
    from torch.nn.attention import SDPBackend

    q = torch.randn(1, HEADS, 1024, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, 1024, 64, device="cuda", dtype=torch.bfloat16)
    picked, why = pick_backend(q, k)
    sdpa = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=True)
    assert picked == ("cudnn" if sdpa == SDPBackend.CUDNN_ATTENTION.value else "flash") and why.startswith("auto: ")
    assert pick_backend(q, k, "flash") == ("flash", "--cp-kernel")
    assert pick_backend(q.float(), k.float())[0] == "math"
