#!/usr/bin/env python3
"""The GPT peers on one GPU: the same decoder-only transformer in plain PyTorch (eager and torch.compile) and in
Megatron-core, same shape, same synthetic data, AdamW, one JSON line per run (experiments/passes/gpt_bench.sh runs them
beside the engine in one job).

    torchrun --nproc_per_node=1 experiments/peers/gpt_peers.py --mode torch|torch-compile|megatron [--hidden 2048 ...]

torch / torch-compile: the plain GPT of plain_gpt.py (pre-LayerNorm blocks, causal attention through
F.scaled_dot_product_attention, GELU MLP of 4x width, learned positions, final LayerNorm, untied LM head, no QKV
bias, as hybrid_engine's GPT) with torch's default initialisation; fp32 weights under bf16 autocast, fused AdamW,
gradient accumulation over the micro-batches.
megatron: megatron_gpt.build_model at tp = pp = 1: megatron-core's GPTModel with its local layer spec (no
TransformerEngine or apex), Float16Module (bf16), its DDP with fp32 gradient reduction and its
distributed-optimizer-free bf16 optimizer (fp32 masters, Adam, its default clipping at 1.0).
MFU is model FLOPs (6 N + 12 layers hidden seq per token, hybrid_engine.metrics.flops) over the datasheet dense peak.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from hybrid_engine.metrics.flops import mfu
from hybrid_engine.models.gpt.flops import gpt_flops_per_token  # noqa: E402
from hybrid_engine.models.gpt.model import GPTConfig  # noqa: E402
from megatron_gpt import build_model as build_megatron  # noqa: E402  (imports megatron only when called)
from plain_gpt import PlainGPT, WithLoss  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", required=True, choices=("torch", "torch-compile", "megatron"))
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--mbs", type=int, default=2, help="sequences per micro-batch")
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    return p.parse_args()


def torch_step_fn(a, cfg, device):
    model = WithLoss(PlainGPT(cfg)).to(device)  # torch's default initialisation
    forward = torch.compile(model) if a.mode == "torch-compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=True)

    def step(batches) -> float:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tokens, targets in batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = forward(tokens, targets) / len(batches)
            loss.backward()
            total += loss.detach()
        opt.step()
        return float(total)

    return step, sum(p.numel() for p in model.parameters())


def megatron_step_fn(a, cfg, device):
    model, opt, _ = build_megatron(cfg, a.lr, device)  # tp = pp = 1, Megatron's default clipping (1.0)
    position_ids = torch.arange(cfg.seq_len, device=device).unsqueeze(0).expand(a.mbs, -1)
    attention_mask = torch.ones(1, 1, cfg.seq_len, cfg.seq_len, device=device).tril().logical_not()

    def step(batches) -> float:
        model.zero_grad_buffer()
        opt.zero_grad()
        total = 0.0
        for tokens, targets in batches:
            per_token = model(tokens, position_ids, attention_mask, labels=targets)
            loss = per_token.float().mean() / len(batches)
            loss.backward()
            total += loss.detach()
        model.finish_grad_sync()
        opt.step()
        return float(total)

    return step, sum(p.numel() for p in model.parameters())


def main() -> None:
    a = parse()
    dist.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=a.vocab, layers=a.layers, hidden=a.hidden, heads=a.heads, seq_len=a.seq)
    gen = torch.Generator(device=device).manual_seed(1)
    batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in
               (torch.randint(0, a.vocab, (a.mbs, a.seq + 1), device=device, generator=gen) for _ in range(a.micro))]
    step, params = (megatron_step_fn if a.mode == "megatron" else torch_step_fn)(a, cfg, device)
    times, losses = [], []
    for i in range(a.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        losses.append(step(batches))
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    step_s = sorted(times)[len(times) // 2]
    tokens_s = a.mbs * a.micro * a.seq / step_s
    flops = gpt_flops_per_token(cfg)
    name = torch.cuda.get_device_name(device)
    print(json.dumps({"system": a.mode, "device": name, "hidden": a.hidden, "layers": a.layers, "heads": a.heads,
                      "seq": a.seq, "vocab": a.vocab, "mbs": a.mbs, "micro": a.micro, "params_m": round(params / 1e6, 1),
                      "step_ms": round(step_s * 1e3, 2), "tokens_s": round(tokens_s), "tflops_per_gpu":
                      round(tokens_s * flops / 1e12, 1), "mfu": mfu(tokens_s, flops, name, "bf16"),
                      "first_loss": losses[0], "last_loss": losses[-1],
                      "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
