"""Causal attention's kernels on one GPU, side by side in one process, at the shapes the engine runs: the dense
call of a whole sequence (the Llama-1B class at 8k tokens, the 8B at 4k) and the context-parallel ring's blocks
(cp 4 at 32k: 8k queries against their own 8k causally, against 4k in full, and 4k against 8k in full).

    flash    aten's flash-attention forward and backward (the blocks' kernel under --cp-kernel flash)
    cudnn    aten's cuDNN attention forward and backward, with the log-sum-exp the ring merges by (the blocks' kernel
             under --cp-kernel auto on Hopper)
    sdpa     F.scaled_dot_product_attention as a plain model calls it (torch picks the kernel; named below)

Each row: forward and backward times (CUDA-event medians after a warm-up), the achieved TFLOP/s of both (the
FLOPs the kernel must do: the causal half of a diagonal block), and cuDNN's output, log-sum-exp and gradients
against flash's (relative error; bf16 lands near 1e-3..1e-2), also its backward given flash's log-sum-exp. The two
kernels are timed on the kv heads expanded to the query heads, which flash needs; `cudnn_gqa` is cuDNN's output on
the kv heads as they are (how the blocks hand them to it) against flash's. One JSON line a shape, then a table.

    python experiments/bench/attention_kernels_bench.py [--repeat 20]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from cuda_events import median_ms

# (name, batch, heads, kv heads, query tokens, key tokens, head dim, causal)
SHAPES = [
    ("llama1b_dense_8k", 1, 32, 8, 8192, 8192, 64, True),
    ("llama8b_dense_4k", 1, 32, 8, 4096, 4096, 128, True),
    ("cp4_32k_own_block", 1, 32, 8, 8192, 8192, 64, True),
    ("cp4_32k_earlier_block", 1, 32, 8, 8192, 4096, 64, False),
    ("cp4_32k_later_block", 1, 32, 8, 4096, 8192, 64, False),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def flash(q, k, v, causal):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
    return out, lse


def flash_backward(dout, q, k, v, out, lse, causal):
    seed = torch.empty(2, device=q.device, dtype=torch.uint64)
    offset = torch.empty((), device=q.device, dtype=torch.uint64)
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, seed, offset)


def cudnn(q, k, v, causal):
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)[:2]
    return out, lse


def cudnn_backward(dout, q, k, v, out, lse, causal):
    empty = torch.empty(0, device=q.device)
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, empty, empty, None, None, None, q.shape[2], k.shape[2], 0.0, causal)


def sdpa_kernel_names(q, k, v, causal) -> list[str]:
    """The attention kernels F.scaled_dot_product_attention launches here, forward and backward."""
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).sum().backward()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    keep = [n for n in names if any(w in n.lower() for w in ("flash", "fmha", "attention", "cudnn", "sm90"))]
    return sorted(n[:90] for n in keep)


def one_shape(name, b, heads, kv_heads, sq, sk, d, causal, repeat):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, heads, sq, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    k_kv = torch.randn(b, kv_heads, sk, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    v_kv = torch.randn(b, kv_heads, sk, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    group = heads // kv_heads
    k, v = k_kv.repeat_interleave(group, 1), v_kv.repeat_interleave(group, 1)
    dout = torch.randn(b, heads, sq, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    pairs = sq * sk / (2 if causal else 1)
    fwd_flops = 4 * b * heads * pairs * d
    row = {"shape": name, "b": b, "heads": heads, "kv_heads": kv_heads, "sq": sq, "sk": sk, "d": d,
           "causal": causal}

    f_out, f_lse = flash(q, k, v, causal)
    f_grads = flash_backward(dout, q, k, v, f_out, f_lse, causal)
    row["flash_fwd_ms"] = median_ms(lambda: flash(q, k, v, causal), repeat, 3)
    row["flash_bwd_ms"] = median_ms(lambda: flash_backward(dout, q, k, v, f_out, f_lse, causal), repeat, 3)
    try:
        c_out, c_lse = cudnn(q, k, v, causal)
        c_grads = cudnn_backward(dout, q, k, v, c_out, c_lse, causal)
        row["cudnn_lse_shape"] = list(c_lse.shape)
        row["cudnn_fwd_ms"] = median_ms(lambda: cudnn(q, k, v, causal), repeat, 3)
        row["cudnn_bwd_ms"] = median_ms(lambda: cudnn_backward(dout, q, k, v, c_out, c_lse, causal), repeat, 3)
        row["cudnn_vs_flash_out"] = rel(c_out, f_out)
        row["cudnn_vs_flash_lse_max_abs"] = float((c_lse.view_as(f_lse) - f_lse).abs().max())
        row["cudnn_vs_flash_grads"] = [rel(c, f) for c, f in zip(c_grads, f_grads)]
        # the backward given flash's (out, lse): what the ring hands it (the merged rows' output and lse)
        x_grads = cudnn_backward(dout, q, k, v, f_out, f_lse.unsqueeze(-1).contiguous(), causal)
        row["cudnn_bwd_given_flash_lse"] = [rel(c, f) for c, f in zip(x_grads, f_grads)]
    except RuntimeError as e:
        row["cudnn_error"] = str(e).splitlines()[0][:200]
    if kv_heads != heads:
        try:
            g_out, _ = cudnn(q, k_kv, v_kv, causal)
            row["cudnn_gqa"] = rel(g_out, f_out)
        except RuntimeError as e:
            row["cudnn_gqa"] = "refused: " + str(e).splitlines()[0][:160]
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k_kv, v_kv))

    def sdpa():
        return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=kv_heads != heads)

    row["sdpa_fwd_ms"] = median_ms(sdpa, repeat, 3)
    y = sdpa()
    row["sdpa_bwd_ms"] = median_ms(lambda: torch.autograd.grad(y, (qg, kg, vg), dout, retain_graph=True), repeat, 3)
    row["sdpa_kernels"] = sdpa_kernel_names(q, k, v, causal)
    for kernel in ("flash", "cudnn", "sdpa"):
        if f"{kernel}_fwd_ms" in row:
            row[f"{kernel}_fwd_tflops"] = fwd_flops / row[f"{kernel}_fwd_ms"] / 1e9
            row[f"{kernel}_bwd_tflops"] = 2.5 * fwd_flops / row[f"{kernel}_bwd_ms"] / 1e9
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    a = p.parse_args()
    print(json.dumps({"card": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version()}), flush=True)
    rows = []
    for shape in SHAPES:
        rows.append(one_shape(*shape, a.repeat))
        print(json.dumps(rows[-1]), flush=True)
    print(f"{'shape':24s} {'flash f/b ms':>16s} {'cudnn f/b ms':>16s} {'sdpa f/b ms':>16s} {'cudnn/flash':>12s}")
    for r in rows:
        both = (r["flash_fwd_ms"] + r["flash_bwd_ms"]) / (r.get("cudnn_fwd_ms", float("nan"))
                                                         + r.get("cudnn_bwd_ms", float("nan")))
        print(f"{r['shape']:24s} {r['flash_fwd_ms']:7.3f}/{r['flash_bwd_ms']:7.3f}  "
              f"{r.get('cudnn_fwd_ms', float('nan')):7.3f}/{r.get('cudnn_bwd_ms', float('nan')):7.3f}  "
              f"{r['sdpa_fwd_ms']:7.3f}/{r['sdpa_bwd_ms']:7.3f}  {both:11.2f}x")


if __name__ == "__main__":
    main()
