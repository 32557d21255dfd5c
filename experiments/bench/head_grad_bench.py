"""The fused linear + cross-entropy's weight gradient on one GPU, two ways side by side in one process, at the 8B
Llama's head (hidden 4096, vocabulary 128256, 4096 tokens a micro-batch, bf16; the loss's chunks of 256 MiB of
fp32 logits):

    half      each chunk's product in bf16, copied to fp32 and added (`acc += (a @ b).float()`)
    fused     one GEMM per chunk that adds its fp32 product into the accumulator (kernels/linear_cross_entropy.py
              add_product)

and the whole loss (forward with its gradients) as the engine runs it. Times are CUDA-event medians of REPEAT
calls after a warm-up; one JSON line.

    python experiments/bench/head_grad_bench.py [--tokens 4096] [--hidden 4096] [--vocab 128256] [--repeat 10]
"""
from __future__ import annotations

import argparse
import json

import torch

from cuda_events import median_ms
from hybrid_engine.kernels.linear_cross_entropy import CHUNK_BYTES, ChunkRegions, add_product, linear_cross_entropy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--repeat", type=int, default=10)
    a = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(a.tokens, a.hidden, device="cuda", generator=gen).bfloat16()
    weight = (torch.randn(a.vocab, a.hidden, device="cuda", generator=gen) * 0.02).bfloat16()
    targets = torch.randint(0, a.vocab, (a.tokens,), device="cuda", generator=gen)
    rows = max(1, CHUNK_BYTES // (4 * a.vocab))
    grad_logits = (torch.randn(rows, a.vocab, device="cuda", generator=gen) * 1e-4).bfloat16()
    acc = torch.zeros(a.vocab, a.hidden, device="cuda")
    chunks = range(0, a.tokens, rows)

    def half():
        for lo in chunks:
            acc.add_((grad_logits[: min(rows, a.tokens - lo)].t() @ x[lo:lo + rows]).float())

    def fused():
        for lo in chunks:
            add_product(acc, grad_logits[: min(rows, a.tokens - lo)].t(), x[lo:lo + rows])

    regions = ChunkRegions(compiled=True)
    xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()

    def loss():
        linear_cross_entropy(xg, wg, targets, None, a.vocab, regions=regions).backward()

    result = {"tokens": a.tokens, "hidden": a.hidden, "vocab": a.vocab, "chunks": len(chunks),
              "card": torch.cuda.get_device_name(), "torch": torch.__version__,
              "half_ms": round(median_ms(half, a.repeat), 2), "fused_ms": round(median_ms(fused, a.repeat), 2),
              "loss_forward_backward_ms": round(median_ms(loss, a.repeat), 2)}
    result["half_over_fused"] = round(result["half_ms"] / result["fused_ms"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
