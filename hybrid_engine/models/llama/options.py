"""What a run chooses for the Llama: its [model] keys and their flags (config/fields.py makes the flags); the
shape it shares with the GPT is models/decoder_options.py's."""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models.decoder_options import DecoderOptions

from .config import Llama3Scaling


@dataclass(frozen=True)
class LlamaOptions(DecoderOptions):
    """A Llama-family decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases)."""

    kv_heads: int = 0
    """Llama: key/value heads of grouped-query attention (0: --heads); --heads must be a multiple of it. Over MP
    they split whole when mp divides them, else every MP rank holds them all (mp must then be a multiple)."""
    ffn_hidden: int = 0
    """Llama: the SwiGLU MLP's width (0: 8/3 x --hidden rounded up to a multiple of 256, Llama's rule)."""
    head_dim: int = 0
    """Llama: features per attention head (0: --hidden / --heads)."""
    rope_theta: float = 10000.0
    """Llama: the base wavelength of the rotary position embeddings."""
    rope_scaling: str | None = None
    """Llama: Llama 3's RoPE frequency scaling as FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POSITIONS
    (e.g. 8,1,4,8192: what an imported config's rope_scaling of type llama3 sets); none: plain RoPE."""
    norm_eps: float = 1e-5
    """Llama: the RMSNorms' epsilon."""
    max_positions: int = 0
    """Llama: the longest sequence the model is for (HF's max_position_embeddings; 0: --seq-len, which may not
    exceed it)."""
    vocab_size: int = 0
    """Llama: the vocabulary (0: the data's); at least the data's (an imported model's may be padded past its
    tokenizer's)."""
    qkv_bias: bool = False
    """Llama: biases on the query, key and value projections (Qwen2's)."""

    def sizes(self) -> tuple[tuple[str, int], ...]:
        return super().sizes() + (("--kv-heads", self.kv_heads), ("--ffn-hidden", self.ffn_hidden),
                                  ("--head-dim", self.head_dim))

    def check(self) -> None:
        super().check()
        for flag, value in (("--kv-heads", self.kv_heads), ("--ffn-hidden", self.ffn_hidden),
                            ("--head-dim", self.head_dim), ("--max-positions", self.max_positions),
                            ("--vocab-size", self.vocab_size)):
            if value < 0:
                raise ConfigError(f"{flag} must be >= 0 (0: its default), got {value}")
        for flag, value, most in (("--max-positions", self.max_positions, 2**31 - 1),
                                  ("--vocab-size", self.vocab_size, 2**32)):
            if value > most:
                raise ConfigError(f"{flag} {value} is too large (at most {most})")
        for flag, value in (("--rope-theta", self.rope_theta), ("--norm-eps", self.norm_eps)):
            if not 0 < value < float("inf"):
                raise ConfigError(f"{flag} must be a positive number, got {value}")
        if self.rope_scaling is not None:
            try:
                Llama3Scaling.parse(self.rope_scaling)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def resolved_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    def resolved_ffn_hidden(self) -> int:
        return self.ffn_hidden or -(-(8 * self.hidden // 3) // 256) * 256
