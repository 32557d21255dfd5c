"""The Llama as a PyTorch user writes it (torchtitan's llama3 shape, nn modules only), for the peers of the engine.

nn.Embedding; per block torch's nn.RMSNorm, separate q/k/v projections, rotary position embeddings in the "rotate
half" form (hybrid_engine/models/llama/config.py's tables, so the numbers are the engine's), causal
F.scaled_dot_product_attention with enable_gqa (grouped-query attention without repeating k and v), o projection,
SwiGLU MLP (w2(silu(w1 x) * w3 x)); final nn.RMSNorm and an untied LM head; no biases.

`load_engine_init` gives the model the engine's initial weights (each layer drawn from its own (seed, layer)
generator, the engine's interleaved k/v rows split into k and v), so that a peer trains the very numbers the
engine trains and the losses compare step by step. `decay_groups` are the param groups of the engine's AdamW:
decay on matrices, never on norms or the embedding.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import common  # noqa: F401  (puts the repository on sys.path)
from hybrid_engine.models.llama import model as engine_llama
from hybrid_engine.models.llama.config import LlamaConfig, apply_rope, rope_tables


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        h, d = cfg.hidden, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, d
        self.attention_norm = nn.RMSNorm(h, eps=cfg.norm_eps)
        self.wq = nn.Linear(h, cfg.heads * d, bias=False)
        self.wk = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wv = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h, eps=cfg.norm_eps)
        self.w1 = nn.Linear(h, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(h, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q = apply_rope(self.wq(y).view(b, s, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.wk(y).view(b, s, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(y).view(b, s, self.kv_heads, self.head_dim)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=self.heads != self.kv_heads)
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, -1))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class PlainLlama(nn.Module):
    """tokens [b, s] -> logits [b, s, V] (the whole model; blocks 0..L-1)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, cfg.seq_len, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x, s = self.tokens(tokens), tokens.shape[1]
        for block in self.blocks:
            x = block(x, self.cos[:s], self.sin[:s])
        return self.head(self.norm(x))


@torch.no_grad()
def load_engine_init(model: PlainLlama) -> PlainLlama:
    """Copy the engine's initial weights (hybrid_engine.models.llama.model, same cfg and seed) into the model."""
    cfg, device = model.cfg, model.head.weight.device
    model.tokens.weight.copy_(engine_llama.Embedding(cfg, device="meta").full_weights(device, torch.float32)["word"])
    for index, block in enumerate(model.blocks, start=1):
        full = engine_llama.Block(cfg, index, device="meta").full_weights(device, torch.float32)
        k, v = full["attn_kv.weight"].view(cfg.kv_heads, 2, cfg.head_dim, cfg.hidden).unbind(1)
        pairs = {"wq": full["attn_q.weight"], "wk": k.reshape(-1, cfg.hidden), "wv": v.reshape(-1, cfg.hidden),
                 "wo": full["attn_out.weight"], "w1": full["mlp_gate.weight"], "w3": full["mlp_up.weight"],
                 "w2": full["mlp_down.weight"]}
        for name, weight in pairs.items():
            getattr(block, name).weight.copy_(weight)
        block.attention_norm.weight.fill_(1.0)
        block.ffn_norm.weight.fill_(1.0)
    model.head.weight.copy_(engine_llama.Head(cfg, device="meta").full_weights(device, torch.float32)
                            ["lm_head.weight"])
    model.norm.weight.fill_(1.0)
    return model


def decay_groups(model: PlainLlama, weight_decay: float) -> list[dict]:
    """AdamW's param groups as the engine forms them: decay on the matrices but the embedding."""
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("tokens.")]
    kept = [p for n, p in model.named_parameters() if p.dim() < 2 or n.startswith("tokens.")]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]
