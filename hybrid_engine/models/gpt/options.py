"""What a run chooses for the GPT: its [model] keys and their flags (config/fields.py makes the flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hybrid_engine.config.engine import ConfigError

MAX_SIZE = 2**16


@dataclass(frozen=True)
class GPTOptions:
    """A decoder-only transformer (GPT-2 style: learned positions, LayerNorm, GELU); its vocabulary is its data's."""

    # Without --optimizer / --lr: plain SGD at 0.01 leaves a GPT sampling noise after hundreds of steps; AdamW at
    # 3e-3 learns a text within minutes on a CPU at the default size (README.md, "The first ten minutes").
    OPTIMIZER: ClassVar[tuple[str, float]] = ("adamw", 3e-3)

    layers: int = 4
    """GPT: transformer blocks."""
    hidden: int = 256
    """GPT: hidden size (the MLP inside each block is 4x wider)."""
    heads: int = 4
    """GPT: attention heads (whole heads per MP rank: divisible by mp)."""
    seq_len: int = 128
    """GPT: tokens per sequence."""
    tie_embeddings: bool = False
    """GPT: the LM head shares the token embedding (their gradients summed across the first and last stage)."""
    sequence_parallel: bool = False
    """GPT: LayerNorm/residual regions split along the sequence over MP (Megatron's sequence parallelism)."""
    fp32_residual: bool = False
    """GPT under --amp with half weights: the residual stream (the embedding's output, every block's input and
    output, the activations between pipeline stages) stays fp32; LayerNorms normalise it in fp32 and hand the
    GEMMs half precision (Megatron's fp32_residual_connection)."""

    def check(self) -> None:
        """Each size in range, before anything is built."""
        for flag, value in (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads),
                            ("--seq-len", self.seq_len)):
            if value > MAX_SIZE:
                raise ConfigError(f"{flag} {value} is too large (at most {MAX_SIZE})")
