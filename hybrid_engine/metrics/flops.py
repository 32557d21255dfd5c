"""MFU against a card's datasheet peak: model FLOP/s (each model counts its own FLOPs per token, e.g.
models/gpt/flops.py) over the dense peak of the card for the dtype.

MFU = achieved model FLOP/s / the card's dense datasheet peak for the dtype. Peaks (NVIDIA H100 and H200
datasheets, SXM, dense -- no 2:4 sparsity): 989 TFLOP/s bf16/fp16, 67 TFLOP/s fp32 without TF32 (494 with TF32).
A card we have no datasheet number for gives None: report tokens/s, never a guessed MFU.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["PEAK_FLOPS", "peak_flops", "mfu"]

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
