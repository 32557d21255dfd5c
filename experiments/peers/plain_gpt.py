"""The GPT as a PyTorch user writes it (nn.Embedding, nn.Linear, nn.LayerNorm), for the peers of the engine.

Same shape as hybrid_engine's GPT (models/gpt.py): learned token and position embeddings, pre-LayerNorm blocks
with causal attention through F.scaled_dot_product_attention and a GELU MLP of 4x width, final LayerNorm,
untied LM head without bias, no QKV bias. The QKV projection's output features are ordered (head, {q, k, v},
head_dim), the engine's (and Megatron's) layout, for two reasons: a contiguous slice of its rows holds whole
heads, so DTensor's ColwiseParallel can split it with no reshuffle (each rank then runs attention over the
heads it holds, found from the width it gets); and the engine's initial weights load as they are.

`PlainGPT(cfg, blocks, embed, head)` is a slice of the model -- the embeddings, a range of blocks, the head --
so that a pipeline stage holds only its own layers. `load_engine_init` gives a slice the engine's initial
weights (each layer drawn from its own (seed, layer) generator on the slice's device, as the engine draws
them), so that a peer trains the very numbers the engine trains and their losses can be compared step by step.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import common  # noqa: F401  (puts the repository on sys.path)
from hybrid_engine.models.gpt import model as engine_gpt
from hybrid_engine.models.gpt.model import GPTConfig, causal_attention, gpt_loss


class Block(nn.Module):
    """x + out(attention(norm1(x))), then + down(gelu(up(norm2(x))))."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.norm1(x))  # under tensor parallelism: this rank's heads only
        x = x + self.out(causal_attention(qkv, qkv.shape[-1] // (3 * self.head_dim)))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class PlainGPT(nn.Module):
    """The embeddings (if `embed`), blocks `blocks` (0-based; default all) and the head (if `head`).
    forward: tokens [b, s] (or the previous slice's hidden states) -> hidden states, or logits with the head."""

    def __init__(self, cfg: GPTConfig, blocks: range | None = None, embed: bool = True, head: bool = True):
        super().__init__()
        self.cfg, self.block_range = cfg, range(cfg.layers) if blocks is None else blocks
        if embed:
            self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
            self.positions = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads) for _ in self.block_range)
        if head:
            self.norm = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "tokens"):
            x = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) if hasattr(self, "head") else x


class WithLoss(nn.Module):
    """model(tokens) -> the engine's loss (mean cross-entropy in fp32): one module to torch.compile whole."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return gpt_loss(self.model(tokens), targets)


@torch.no_grad()
def load_engine_init(model: PlainGPT) -> PlainGPT:
    """Copy the engine's initial weights (hybrid_engine.models.gpt.model, same cfg and seed) into this slice."""
    cfg = model.cfg
    device = next(model.parameters()).device
    if hasattr(model, "tokens"):
        full = engine_gpt.Embedding(cfg, device="meta").full_weights(device, torch.float32)
        model.tokens.weight.copy_(full["word"])
        model.positions.weight.copy_(full["position"])
    names = {"qkv": "attn_qkv", "out": "attn_proj", "up": "mlp_fc1", "down": "mlp_fc2"}
    for index, block in zip(model.block_range, model.blocks):
        full = engine_gpt.Block(cfg, index + 1, device="meta").full_weights(device, torch.float32)
        for ours, theirs in names.items():
            linear = getattr(block, ours)
            linear.weight.copy_(full[f"{theirs}.weight"])
            if linear.bias is not None:
                linear.bias.zero_()
        _identity(block.norm1)
        _identity(block.norm2)
    if hasattr(model, "head"):
        full = engine_gpt.Head(cfg, device="meta").full_weights(device, torch.float32)
        model.head.weight.copy_(full["lm_head.weight"])
        _identity(model.norm)
    return model


def _identity(norm: nn.LayerNorm) -> None:
    norm.weight.fill_(1.0)
    norm.bias.zero_()
