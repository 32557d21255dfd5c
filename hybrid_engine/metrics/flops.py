"""Model FLOPs per token and MFU against a card's datasheet peak.

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

MFU = achieved model FLOP/s / the card's dense datasheet peak for the dtype. Peaks (NVIDIA H100 and H200
datasheets, SXM, dense -- no 2:4 sparsity): 989 TFLOP/s bf16/fp16, 67 TFLOP/s fp32 without TF32 (494 with TF32).
A card we have no datasheet number for gives None: report tokens/s, never a guessed MFU.
"""
from __future__ import annotations

from typing import Optional

import torch

from hybrid_engine.models.gpt.model import GPTConfig

__all__ = ["gpt_param_count", "gpt_matmul_params", "gpt_flops_per_token", "PEAK_FLOPS", "peak_flops", "mfu"]

# (card name fragment, dtype) -> dense FLOP/s from the datasheet. Matched on torch.cuda.get_device_name().
PEAK_FLOPS: dict[tuple[str, str], float] = {
    ("H100", "bf16"): 989e12,
    ("H100", "fp16"): 989e12,
    ("H100", "tf32"): 494e12,
    ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12,
    ("H200", "fp16"): 989e12,
    ("H200", "tf32"): 494e12,
    ("H200", "fp32"): 67e12,
}
# PCIe and NVL H100s have lower clocks and peaks; only the SXM parts are in the table.
_NOT_SXM = ("PCIe", "NVL")

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


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


def _dtype_name(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"no peak for dtype {dtype}")
        return _DTYPE_NAMES[dtype]
    name = str(dtype).lower().replace("bfloat16", "bf16").replace("float16", "fp16").replace("float32", "fp32")
    return {"half": "fp16", "float": "fp32"}.get(name, name)


def peak_flops(device_name: str, dtype) -> Optional[float]:
    """Datasheet dense FLOP/s of the card named `device_name` (e.g. 'NVIDIA H100 80GB HBM3') for `dtype`
    (torch dtype or 'bf16' / 'fp16' / 'fp32' / 'tf32'); None for a card or dtype not in the table."""
    if not device_name or any(tag in device_name for tag in _NOT_SXM):
        return None
    name = _dtype_name(dtype)
    for (card, kind), value in PEAK_FLOPS.items():
        if card in device_name and kind == name:
            return value
    return None


def mfu(tokens_per_s: float, flops_per_token: float, device_name: str, dtype) -> Optional[float]:
    """Model FLOPs utilisation of one card: tokens/s x FLOPs/token / datasheet peak; None for an unknown card.
    Pass per-GPU tokens/s (the global rate divided by the number of GPUs)."""
    peak = peak_flops(device_name, dtype)
    if peak is None:
        return None
    return tokens_per_s * flops_per_token / peak
