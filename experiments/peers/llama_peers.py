#!/usr/bin/env python3
"""The Llama's peers: what a user would run instead of the engine, one JSON line per run.

    torchrun --nproc_per_node=1 experiments/peers/llama_peers.py --mode torch|torch-compile|hf|hf-compile|megatron \
        --data TOKENS
    torchrun --nproc_per_node=4 experiments/peers/llama_peers.py --mode megatron-pp-tp --data TOKENS

torch / torch-compile: the plain Llama of plain_llama.py (nn.RMSNorm, RoPE, SDPA with enable_gqa, SwiGLU), the
engine's initial weights, bf16 autocast over fp32 weights, fused AdamW with the engine's recipe (weight decay on the
matrices only, betas 0.9/0.95, clipping at 1.0), gradient accumulation over the micro-batches; torch-compile
compiles the model with its loss whole. hf / hf-compile: Hugging Face transformers' LlamaForCausalLM (SDPA
attention, untied head; its own initial weights) under the same recipe, its loss (labels) compiled with the model
in hf-compile: what a team that takes the model from transformers trains. megatron: Megatron-core's GPTModel as a Llama, local spec
(megatron_llama.py: what it refuses without TE/apex), tp = pp = 1; megatron-pp-tp: tp 2 x pp (ranks / 2).
The engine's draw of every step is every peer's data (gpt_peer_run.py); the torch peers' per-step losses compare
with the engine's (same weights), Megatron's only in size (its own initial weights). MFU: model FLOPs
(models/llama/flops.py: 6 N + 12 L s heads d per token) over the datasheet dense peak.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

import common  # first of ours: it puts the repository on sys.path
import gpt_peer_run
from hybrid_engine.data import open_dataset
from hybrid_engine.metrics.flops import mfu
from hybrid_engine.models.decoder import next_token_loss
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.flops import llama_flops_per_token, llama_param_count
from plain_llama import PlainLlama, decay_groups, load_engine_init

MODES = ("torch", "torch-compile", "hf", "hf-compile", "megatron", "megatron-pp-tp")
RECIPE = {"weight_decay": 0.1, "betas": (0.9, 0.95), "clip_grad": 1.0}  # the device pass gives the engine these


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--data", required=True, help="token file (hybrid_engine.data); its vocabulary is the model's")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn-hidden", type=int, default=5632)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="steps, warm-up included")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0, help="data draw and (torch peers) the engine's initial weights")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: autocast over fp32 weights (Megatron: its own bf16); fp32: no autocast, no TF32")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for the tests")
    a = p.parse_args()
    gpt_peer_run.check_args(a)
    return a


def hf_llama(cfg: LlamaConfig, device: torch.device) -> tuple[torch.nn.Module, object, list[dict]]:
    """transformers' LlamaForCausalLM of the same shape, its loss of (inputs, next tokens) and AdamW's groups as the
    engine forms them (decay on the matrices but the embedding)."""
    import transformers  # only here: the other modes never import it

    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.seq_len, rope_theta=cfg.rope_theta, tie_word_embeddings=False,
        attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(device).train()
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    kept = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
    groups = [{"params": decayed, "weight_decay": RECIPE["weight_decay"]}, {"params": kept, "weight_decay": 0.0}]
    # x and y are the engine's shifted pair; the model's own loss would shift labels again, so the logits' loss
    return model, lambda x, y: next_token_loss(model(input_ids=x).logits, y), groups


def torch_step(a: argparse.Namespace, cfg: LlamaConfig, device: torch.device):
    if dist.get_world_size() != 1:
        common.fail(f"--mode {a.mode} runs on one process (torchrun --nproc_per_node=1)")
    if a.mode.startswith("hf"):
        model, loss_of, groups = hf_llama(cfg, device)
    else:
        model = load_engine_init(PlainLlama(cfg).to(device))
        loss_of = lambda x, y: next_token_loss(model(x), y)  # noqa: E731  (compiled whole, model and loss)
        groups = decay_groups(model, RECIPE["weight_decay"])
    forward = torch.compile(loss_of) if a.mode.endswith("-compile") else loss_of
    optimizer = torch.optim.AdamW(groups, lr=a.lr, betas=RECIPE["betas"],
                                  fused=device.type == "cuda")
    dtype = torch.bfloat16 if a.precision == "bf16" else None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for xb, yb in zip(x.chunk(a.micro_batches), y.chunk(a.micro_batches)):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = forward(xb, yb) / a.micro_batches
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["clip_grad"], foreach=True)
        optimizer.step()
        return total

    return step, {"system": a.mode, "pp": 1, "tp": 1, "params_m": round(llama_param_count(cfg) / 1e6, 1),
                  "optimizer": "AdamW (fused on CUDA), decay 0.1 on matrices, betas 0.9/0.95, clipping 1.0",
                  "init": "its own (transformers')" if a.mode.startswith("hf") else "the engine's initial weights"}


def build(a: argparse.Namespace, cfg: LlamaConfig, device: torch.device):
    if a.mode.startswith(("torch", "hf")):
        return torch_step(a, cfg, device)
    if device.type != "cuda":
        common.fail(f"--mode {a.mode}: Megatron-core runs on CUDA only")
    import megatron_llama  # only here: the CPU modes never import megatron
    world = dist.get_world_size()
    pp, tp = (1, 1) if a.mode == "megatron" else (world // 2, 2)
    if pp * tp != world:
        common.fail(f"--mode {a.mode}: tp {tp} x pp {pp} must use all {world} ranks")
    return megatron_llama.build_step(a, cfg, device, pp=pp, tp=tp)


def emit(a: argparse.Namespace, cfg: LlamaConfig, device: torch.device, times: list[float], losses: list[float],
         **fields) -> None:
    """The run's JSON line, from the last rank (collective: every rank's peak memory is gathered)."""
    world = dist.get_world_size()
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0],
                        device=device)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if dist.get_rank() != world - 1:
        return
    step_s = statistics.median(times)
    tokens_s = a.batch_size * a.seq_len / step_s
    flops = llama_flops_per_token(cfg)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(json.dumps({**fields, "mode": a.mode, "device": name, "gpus": world, "precision": a.precision,
                      "hidden": cfg.hidden, "layers": cfg.layers, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
                      "ffn": cfg.ffn_hidden, "seq": cfg.seq_len, "vocab": cfg.vocab_size, "batch": a.batch_size,
                      "micro": a.micro_batches, "step_ms": round(step_s * 1e3, 2), "tokens_s": round(tokens_s),
                      "tflops_per_gpu": round(tokens_s * flops / world / 1e12, 1),
                      "mfu": mfu(tokens_s / world, flops, name, a.precision),
                      "peak_gib": [round(float(p), 2) for p in peaks], "losses": losses, "timed_steps": len(times)}),
          flush=True)


def main() -> None:
    a = parse()
    device = gpt_peer_run.init_distributed(a)
    torch.manual_seed(a.seed)
    data = open_dataset(a.data, a.seq_len, a.seed)
    cfg = LlamaConfig(data.vocab_size, a.layers, a.hidden, a.heads, a.kv_heads, a.ffn_hidden, a.seq_len,
                      rope_theta=a.rope_theta, seed=a.seed)
    step, fields = build(a, cfg, device)
    times, losses = gpt_peer_run.run_steps(step, [data.batch(t, a.batch_size) for t in range(a.steps)], device,
                                           a.warmup)
    emit(a, cfg, device, times, losses, **fields)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The record is out: skip the interpreter's teardown, where a library thread still joinable now and then aborts
    # the process (SIGABRT, "terminate called without an active exception"), after the run's work is all done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
