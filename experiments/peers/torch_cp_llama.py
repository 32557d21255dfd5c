#!/usr/bin/env python3
"""torch's own context parallelism on the Llama, the engine's long-sequence peer: one JSON line per run.

    torchrun --nproc_per_node=4 experiments/peers/torch_cp_llama.py --data TOKENS --seq-len 32768

The plain Llama of plain_llama.py (the engine's initial weights), its k/v heads repeated before SDPA (as torchtitan
does: torch's context parallelism dispatches SDPA's flash and efficient kernels, not grouped-query attention),
under `torch.distributed.tensor.experimental.context_parallel` over all ranks (head-tail load balancing, torch's
default; K/V rotated by all-gather, its default, or --rotate alltoall), DDP averaging the gradients over the same
ranks, bf16 autocast over fp32 weights, fused AdamW with the engine's recipe (decay 0.1 on matrices, betas
0.9/0.95, clipping 1.0). MFU: model FLOPs (models/llama/flops.py: 6 N + 12 L s heads d per token) over the
datasheet dense peak; `sdpa_kernel` names the kernel SDPA picks for a rank's attention. A run torch refuses (e.g.
the CPU, which its dispatch does not cover) prints its error as the JSON line's "error".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import common  # noqa: F401  (first of ours: it puts the repository on sys.path)
import plain_llama
from hybrid_engine.data import open_dataset
from hybrid_engine.metrics.flops import mfu
from hybrid_engine.models.decoder import next_token_loss
from hybrid_engine.models.llama.config import LlamaConfig, apply_rope
from hybrid_engine.models.llama.flops import llama_flops_per_token


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="token file (hybrid_engine.data); its vocabulary is the model's")
    for name, default in (("hidden", 2048), ("layers", 16), ("heads", 32), ("kv-heads", 8), ("ffn-hidden", 5632),
                          ("seq-len", 32768), ("steps", 5), ("warmup", 2), ("seed", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--rotate", choices=("allgather", "alltoall"), default="allgather")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    return p.parse_args()


def block_forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """plain_llama.Block.forward with k and v repeated to the query heads (torchtitan's repeat_kv)."""
    b, s, _ = x.shape
    y = self.attention_norm(x)
    q = apply_rope(self.wq(y).view(b, s, self.heads, self.head_dim), cos, sin)
    k = apply_rope(self.wk(y).view(b, s, self.kv_heads, self.head_dim), cos, sin)
    v = self.wv(y).view(b, s, self.kv_heads, self.head_dim)
    group = self.heads // self.kv_heads
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    x = x + self.wo(y.transpose(1, 2).reshape(b, s, -1))
    y = self.ffn_norm(x)
    return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def sdpa_kernel(a: argparse.Namespace, world: int, device: torch.device) -> str:
    """The kernel torch's SDPA picks for one rank's attention here (its heads repeated, a cp rank's tokens)."""
    from torch.nn.attention import SDPBackend

    names = {getattr(SDPBackend, n).value: n.lower() for n in dir(SDPBackend) if n.isupper()}
    q = torch.empty(1, a.heads, a.seq_len // world, a.hidden // a.heads, device=device, dtype=torch.bfloat16)
    return names[torch._fused_sdp_choice(q, q, q, is_causal=True)]


def main() -> None:
    a = parse()
    world_rank = int(os.environ.get("RANK", 0))
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    world = dist.get_world_size()
    data = open_dataset(a.data, a.seq_len, a.seed)
    cfg = LlamaConfig(data.vocab_size, a.layers, a.hidden, a.heads, a.kv_heads, a.ffn_hidden, a.seq_len,
                      rope_theta=a.rope_theta, seed=a.seed)
    out = {"system": "torch context_parallel (SDPA, DDP)", "gpus": world, "cp": world, "seq": a.seq_len,
           "rotate": a.rotate, "device": torch.cuda.get_device_name(device) if a.device == "cuda" else "cpu"}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        plain_llama.Block.forward = block_forward
        model = plain_llama.load_engine_init(plain_llama.PlainLlama(cfg).to(device))
        # the RoPE tables are sharded in place per rank by context_parallel: DDP must not broadcast rank 0's
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if a.device == "cuda"
                                                        else None, broadcast_buffers=False)
        optimizer = torch.optim.AdamW(plain_llama.decay_groups(model, 0.1), lr=a.lr, betas=(0.9, 0.95),
                                      fused=a.device == "cuda")
        mesh = init_device_mesh(a.device, (world,), mesh_dim_names=("cp",))
        set_rotate_method(a.rotate)
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            out["sdpa_kernel"] = sdpa_kernel(a, world, device)
        times, losses = [], []
        for step in range(a.steps):
            x, y = (t.to(device) for t in data.batch(step, 1))
            if a.device == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with context_parallel(mesh, buffers=[x, y, model.cos, model.sin], buffer_seq_dims=[1, 1, 0, 0],
                                  no_restore_buffers={x, y}):
                with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.device == "cuda"):
                    loss = next_token_loss(ddp(x), y)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            total = loss.detach().reshape(1) / world
            dist.all_reduce(total)
            losses.append(float(total))
            if step >= a.warmup:
                times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        tokens_s = a.seq_len / step_s
        flops = llama_flops_per_token(cfg)
        peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30 if a.device == "cuda" else 0.0],
                            device=device)
        peaks = [torch.zeros_like(peak) for _ in range(world)]
        dist.all_gather(peaks, peak)
        out |= {"step_ms": round(step_s * 1e3, 2), "tokens_s": round(tokens_s),
                "tflops_per_gpu": round(tokens_s * flops / world / 1e12, 1),
                "mfu": mfu(tokens_s / world, flops, out["device"], "bf16"),
                "peak_gib": [round(float(p), 2) for p in peaks], "losses": losses}
    except Exception as exc:  # noqa: BLE001 - the peer's refusal is a result too
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if world_rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
