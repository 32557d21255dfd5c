"""The shape of a Llama-family model, and the rotary position embedding it derives from it.

RoPE (Su et al. 2021, https://arxiv.org/abs/2104.09864) in the "rotate half" form of Hugging Face's Llama: the
first and second halves of each head's features form the rotated pairs, so imported q/k weights need no
permutation. With Llama-3 frequency scaling (rope_type "llama3" of an HF config) the inverse frequencies are
rescaled as in Meta's Llama 3.1 reference: long wavelengths divided by `factor`, short ones kept, the band between
interpolated. Tables are computed in fp32 and cast to the activations' dtype where they are used, as HF does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["LlamaConfig", "Llama3Scaling", "inverse_frequencies", "rope_tables", "apply_rope"]


@dataclass(frozen=True)
class Llama3Scaling:
    """HF's rope_scaling of rope_type "llama3" (Llama 3.1 and later)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int

    @staticmethod
    def parse(text: str) -> "Llama3Scaling":
        """'FACTOR,LOW,HIGH,ORIGINAL_MAX_POSITIONS' (the --rope-scaling flag), e.g. '8,1,4,8192'."""
        parts = text.split(",")
        if len(parts) != 4:
            raise ValueError(f"--rope-scaling takes FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POSITIONS "
                             f"(e.g. 8,1,4,8192), got {text!r}")
        try:
            factor, low, high = (float(p) for p in parts[:3])
            original = int(parts[3])
        except ValueError:
            raise ValueError(f"--rope-scaling {text!r}: three numbers and a whole number expected") from None
        if not (factor >= 1 and 0 < low < high and original >= 1):
            raise ValueError(f"--rope-scaling {text!r}: needs factor >= 1, 0 < low < high frequency factor and "
                             "original positions >= 1")
        return Llama3Scaling(factor, low, high, original)

    def text(self) -> str:
        return f"{self.factor:g},{self.low_freq_factor:g},{self.high_freq_factor:g},{self.original_max_positions}"


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention; no biases but Qwen2's on
    q, k and v)."""

    vocab_size: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    seq_len: int  # the length trained on; the RoPE tables are precomputed for it
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Llama3Scaling | None = None
    norm_eps: float = 1e-5
    head_dim: int = 0  # 0: hidden / heads
    max_positions: int = 0  # the longest sequence the model is for (HF max_position_embeddings); 0: seq_len
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Llama {name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not self.head_dim:
            if self.hidden % self.heads:
                raise ValueError(f"Llama hidden {self.hidden} is not divisible by heads {self.heads} (give head-dim)")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.head_dim % 2:
            raise ValueError(f"Llama head-dim {self.head_dim} is odd: RoPE rotates pairs of features")
        if self.heads % self.kv_heads:
            raise ValueError(f"Llama heads {self.heads} is not divisible by kv-heads {self.kv_heads}")
        if not self.max_positions:
            object.__setattr__(self, "max_positions", self.seq_len)
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ValueError(f"Llama rope-theta must be a positive number, got {self.rope_theta}")
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise ValueError(f"Llama norm-eps must be a positive number, got {self.norm_eps}")

    @property
    def context(self) -> int:
        """The longest sequence the model takes (generation crops its context to it)."""
        return self.max_positions

    @property
    def num_layers(self) -> int:
        """Modules of the nn.Sequential: embedding, blocks, head."""
        return self.layers + 2


def inverse_frequencies(cfg: LlamaConfig) -> torch.Tensor:
    """RoPE's inverse frequencies, fp32 [head_dim / 2], on the CPU (HF's computation, operation for operation)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(cfg: LlamaConfig, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), fp32 [length, head_dim], of positions 0 .. length - 1."""
    inv = inverse_frequencies(cfg).to(device)
    freqs = torch.arange(length, device=device, dtype=torch.int64).float()[:, None] * inv[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, s, heads, d] rotated by position: x cos + rotate_half(x) sin, in x's dtype."""
    cos, sin = cos.to(x.dtype)[None, :, None, :], sin.to(x.dtype)[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
