#!/usr/bin/env python3
"""The GPT peers on one GPU: the same decoder-only transformer in plain PyTorch (eager and torch.compile) and in
Megatron-core, same shape, same synthetic data, AdamW, one JSON line per run (experiments/gpt_bench.sh runs them
beside the engine in one job).

    torchrun --nproc_per_node=1 experiments/gpt_peers.py --mode torch|torch-compile|megatron [--hidden 2048 ...]

torch / torch-compile: pre-LayerNorm blocks, causal attention through F.scaled_dot_product_attention, GELU MLP of
4x width, learned positions, final LayerNorm, untied LM head, no QKV bias (as hybrid_engine's GPT); fp32 weights
under bf16 autocast, fused AdamW, gradient accumulation over the micro-batches.
megatron: megatron-core's GPTModel with its local layer spec (no TransformerEngine or apex), Float16Module (bf16),
its DDP with fp32 gradient reduction and its distributed-optimizer-free bf16 optimizer (fp32 masters, Adam).
MFU is model FLOPs (6 N + 12 layers hidden seq per token, hybrid_engine.flops) over the datasheet dense peak.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hybrid_engine.flops import gpt_flops_per_token, mfu  # noqa: E402
from hybrid_engine.models.gpt import GPTConfig  # noqa: E402


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


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class PlainGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(cfg.vocab_size, cfg.hidden), nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads) for _ in range(cfg.layers))
        self.norm, self.head = nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def torch_step_fn(a, cfg, device):
    model = PlainGPT(cfg).to(device)
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
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    tcfg = TransformerConfig(num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                             ffn_hidden_size=4 * cfg.hidden, bf16=True, params_dtype=torch.bfloat16,
                             pipeline_dtype=torch.bfloat16, add_qkv_bias=False, hidden_dropout=0.0,
                             attention_dropout=0.0)
    model = GPTModel(config=tcfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=cfg.vocab_size,
                     max_sequence_length=cfg.seq_len, position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=False).to(device)
    model = Float16Module(tcfg, model)
    model = DistributedDataParallel(tcfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=a.lr, bf16=True, weight_decay=0.01), [model])
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
