"""The fused elementwise modules: RMSNorm, rotary position embeddings and SwiGLU, each the plain module's
computation as one region (kernels/options.py's `region`: a torch.compile'd Triton kernel for forward and one for
backward on CUDA, the same code eagerly elsewhere). Each takes what the module it replaces takes, so the layers
around it (a sequence-parallel norm handing in its weight, selective recompute of the attention core) are
unchanged.

RMSNorm normalises in fp32 whatever the input dtype and returns the input's dtype. RoPE takes the cos and sin
rows of each token's position, [s, d] shared by the batch or [b, s, d] per sequence, so positions need not be
0 .. s - 1 (a context-parallel chunk's are not); `rope_rows` gathers them from the tables by position ids."""
from __future__ import annotations

import torch
from torch import nn

from .options import region

__all__ = ["rms_norm", "rope", "rope_rows", "swiglu", "FusedRMSNorm", "FusedRotary", "FusedSwiGLU"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q [b, s, heads, d] and k [b, s, kv_heads, d] rotated by the rows cos, sin ([s, d] or [b, s, d]), in q's
    dtype: x cos + rotate_half(x) sin."""
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def rope_rows(cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor):
    """The cos and sin rows of `positions` (int64 [s] or [b, s], any order and gaps) from tables [n, d]."""
    return cos_table[positions], sin_table[positions]


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    return gate * torch.sigmoid(gate) * up


class FusedRMSNorm(nn.Module):
    """The model's RMSNorm as one region: the same `weight` parameter (or none, when a sequence-parallel norm
    holds it and hands it in) and `forward(x, weight=None)`."""

    def __init__(self, norm: nn.Module, compiled: bool):
        super().__init__()
        self.eps = norm.eps
        weight = norm._parameters.get("weight")
        if weight is not None:
            self.weight = weight
        self._fn = region(rms_norm, compiled)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return self._fn(x, self.weight if weight is None else weight, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


class FusedRotary(nn.Module):
    """rope(q, k, cos, sin) as one region for q and k together."""

    def __init__(self, compiled: bool):
        super().__init__()
        self._fn = region(rope, compiled)

    def forward(self, q, k, cos, sin):
        return self._fn(q, k, cos, sin)


class FusedSwiGLU(nn.Module):
    """silu(gate) * up as one region (the gate's sigmoid never stored apart)."""

    def __init__(self, compiled: bool):
        super().__init__()
        self._fn = region(swiglu, compiled)

    def forward(self, gate, up):
        return self._fn(gate, up)
