"""The GPT's model FLOPs per token and its parameter counts.

FLOPs per token of training (forward + backward), the PaLM convention (Chowdhery et al. 2022, appendix B) that
Megatron-LM also reports:

    6 N + 12 L h s

6 N: the matmuls against N parameters, 2 FLOPs per multiply-add, forward 1x and backward 2x. 12 L h s: the
attention scores and their weighted sum (2 matmuls of s x d x s per head forward, 6 FLOPs per multiply-add
with the backward) -- counted for the full s x s square, as is customary, although causal attention needs half.

Which parameters are N (`gpt_matmul_params`, the default): every parameter of the blocks and the final
LayerNorm, plus the LM head's V x h matrix (a matmul: counted even when tied to the token embedding). Not the
token and position embeddings: looking a row up is no matmul. LayerNorm weights and biases are in N; they are
0.1 % of it. `gpt_param_count(cfg)` counts every parameter (what `sum(p.numel())` gives, the anchors'
convention in ../shared/anchors/gpt_peers.py); pass `all_params=True` to `gpt_flops_per_token` to match them
(+7 % at the 941M anchor model).
"""
from __future__ import annotations

from .model import GPTConfig

__all__ = ["gpt_param_count", "gpt_matmul_params", "gpt_flops_per_token"]


def gpt_param_count(cfg: GPTConfig) -> int:
    """Every parameter of the dense model (token and position embeddings included; a tied head counted once)."""
    h, v = cfg.hidden, cfg.vocab_size
    block = 2 * 2 * h + 3 * h * h + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    head = 2 * h + (0 if cfg.tie_embeddings else v * h)
    return v * h + cfg.seq_len * h + cfg.layers * block + head


def gpt_matmul_params(cfg: GPTConfig) -> int:
    """N of 6 N: all parameters but the token and position embeddings, plus the LM head's V x h (even tied)."""
    h, v = cfg.hidden, cfg.vocab_size
    return gpt_param_count(cfg) - v * h - cfg.seq_len * h + (v * h if cfg.tie_embeddings else 0)


def gpt_flops_per_token(cfg: GPTConfig, all_params: bool = False) -> float:
    """Training FLOPs per token, 6 N + 12 L h s (N = gpt_matmul_params, or every parameter with all_params)."""
    n = gpt_param_count(cfg) if all_params else gpt_matmul_params(cfg)
    return 6.0 * n + 12.0 * cfg.layers * cfg.hidden * cfg.seq_len
