"""What a run chooses for the GPT: its [model] keys and their flags (config/fields.py makes the flags)."""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.models.decoder_options import DecoderOptions


@dataclass(frozen=True)
class GPTOptions(DecoderOptions):
    """A decoder-only transformer (GPT-2 style: learned positions, LayerNorm, GELU); its vocabulary is its data's."""

    fp32_residual: bool = False
    """GPT under --amp with half weights: the residual stream (the embedding's output, every block's input and
    output, the activations between pipeline stages) stays fp32; LayerNorms normalise it in fp32 and hand the
    GEMMs half precision (Megatron's fp32_residual_connection)."""
