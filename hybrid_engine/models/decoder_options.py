"""The [model] keys and flags the decoder-only transformers share (GPT, Llama): each model's options class extends
this one, so a shared key is written once and is one flag (config/fields.py reads the documentation of inherited
fields from the class that declares them)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.config.fields import flag
from hybrid_engine.kernels.options import FP8_RECIPES, FP8_WEIGHT_CACHE_MODES, FUSED_MODES, KernelOptions, resolve

MAX_SIZE = 2**16
MAX_SEQ_LEN = 2**20  # long-context training (context parallelism) reaches 128k tokens and beyond


@dataclass(frozen=True)
class DecoderOptions:
    """A decoder-only transformer's shape and its sequence parallelism."""

    # Without --optimizer / --lr: plain SGD at 0.01 leaves a GPT sampling noise after hundreds of steps; AdamW at
    # 3e-3 learns a text within minutes on a CPU at the default size (README.md, "The first ten minutes").
    OPTIMIZER: ClassVar[tuple[str, float]] = ("adamw", 3e-3)

    layers: int = 4
    """GPT, Llama: transformer blocks."""
    hidden: int = 256
    """GPT, Llama: hidden size (the GPT's MLP is 4x wider; the Llama's is --ffn-hidden wide)."""
    heads: int = 4
    """GPT, Llama: attention heads (query heads for the Llama; whole heads per MP rank: divisible by mp)."""
    seq_len: int = 128
    """GPT, Llama: tokens per sequence."""
    tie_embeddings: bool = False
    """GPT, Llama: the LM head shares the token embedding (their gradients summed across the first and last
    stage)."""
    sequence_parallel: bool = False
    """GPT, Llama: norm/residual regions split along the sequence over MP (Megatron's sequence parallelism)."""
    fused_kernels: str = field(default="auto", metadata=flag(choices=FUSED_MODES))
    """GPT, Llama: a linear + cross-entropy over chunks of tokens that never holds the whole fp32 logits, and the
    Llama's RMSNorm, RoPE and SwiGLU fused: on (compiled Triton regions on CUDA, eager elsewhere), off, or auto (on
    where CUDA and Triton are, except the elementwise modules under tensor parallelism: measured slower there)."""
    fp8: bool = False
    """GPT, Llama: the blocks' linear layers multiply in float8 with dynamic scales (the LM head, the masters and the
    optimizer keep their precision); needs a card of compute capability 8.9 or later, emulated on the CPU."""
    fp8_recipe: str = field(default="tensorwise", metadata=flag(choices=FP8_RECIPES))
    """GPT, Llama: with --fp8, tensorwise (one scale a tensor, e5m2 gradients) or rowwise (one scale a row along each
    GEMM's contracted dimension, e4m3 gradients)."""
    fp8_weight_cache: str = field(default="auto", metadata=flag(choices=FP8_WEIGHT_CACHE_MODES))
    """GPT, Llama: with --fp8, each block weight quantized once a step and its fp8 forms kept through the step's
    micro-batches (2 bytes a weight parameter, counted by the planner) instead of quantized every micro-batch: on,
    off, or auto (on, except under ZeRO-3, whose released weights the cache would keep)."""

    def sizes(self) -> tuple[tuple[str, int], ...]:
        """(flag, value) of every size the model has, checked against MAX_SIZE."""
        return (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads),
                ("--seq-len", self.seq_len))

    def kernels(self, device_type: str, card: str | None = None, mp: int = 1, zero: int = 0) -> KernelOptions:
        """The fused kernels and fp8 GEMMs this run gets on `device_type` (or on the Hopper `card` planned for)
        with its layers split over `mp` ranks, at ZeRO level `zero`; ConfigError (one line) for fp8 on a card
        without it."""
        return resolve(self.fused_kernels, self.fp8, self.fp8_recipe, device_type, card, mp, self.fp8_weight_cache,
                       zero)

    def check(self) -> None:
        """Each size in range, before anything is built."""
        for flag, value in self.sizes():
            most = MAX_SEQ_LEN if flag == "--seq-len" else MAX_SIZE
            if value > most:
                raise ConfigError(f"{flag} {value} is too large (at most {most})")
