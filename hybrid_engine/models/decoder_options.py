"""The [model] keys and flags the decoder-only transformers share (GPT, Llama): each model's options class extends
this one, so a shared key is written once and is one flag (config/fields.py reads the documentation of inherited
fields from the class that declares them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hybrid_engine.config.engine import ConfigError

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

    def sizes(self) -> tuple[tuple[str, int], ...]:
        """(flag, value) of every size the model has, checked against MAX_SIZE."""
        return (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads),
                ("--seq-len", self.seq_len))

    def check(self) -> None:
        """Each size in range, before anything is built."""
        for flag, value in self.sizes():
            most = MAX_SEQ_LEN if flag == "--seq-len" else MAX_SIZE
            if value > most:
                raise ConfigError(f"{flag} {value} is too large (at most {most})")
