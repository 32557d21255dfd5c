"""The Llama's parameter counts and model FLOPs per token, in the convention of the GPT's (models/gpt/flops.py):
6 N + 12 L s (heads d) per token of training, N the matmul parameters (every block parameter, the final norm and
the LM head's V x h even when tied; not the token embedding, a lookup)."""
from __future__ import annotations

from .config import LlamaConfig

__all__ = ["llama_param_count", "llama_matmul_params", "llama_flops_per_token"]


def _block_params(cfg: LlamaConfig) -> int:
    h, d = cfg.hidden, cfg.head_dim
    bias = (cfg.heads + 2 * cfg.kv_heads) * d if cfg.qkv_bias else 0
    return h * d * (2 * cfg.heads + 2 * cfg.kv_heads) + 3 * h * cfg.ffn_hidden + 2 * h + bias


def llama_param_count(cfg: LlamaConfig) -> int:
    """Every parameter of the model (a tied head counted once)."""
    v, h = cfg.vocab_size, cfg.hidden
    return v * h + cfg.layers * _block_params(cfg) + h + (0 if cfg.tie_embeddings else v * h)


def llama_matmul_params(cfg: LlamaConfig) -> int:
    """N of 6 N: the blocks, the final norm and the LM head."""
    return cfg.layers * _block_params(cfg) + cfg.hidden + cfg.vocab_size * cfg.hidden


def llama_flops_per_token(cfg: LlamaConfig) -> float:
    """Training FLOPs per token: 6 N + 12 L s heads d (attention scores and their weighted sum, the full square)."""
    return 6.0 * llama_matmul_params(cfg) + 12.0 * cfg.layers * cfg.seq_len * cfg.heads * cfg.head_dim
