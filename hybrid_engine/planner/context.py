"""A model's shape as one context-parallel rank sees it: each sample is cut over the cp ranks, so a rank computes
and keeps 1 / cp of every sample's tokens (their attention still spans the whole sequence: a token's attention
FLOPs are unchanged), and its activation memory is the sequence's / cp -- what lets a 128k-token sequence fit."""
from __future__ import annotations

import dataclasses

from hybrid_engine.models.planner_shape import ModelShape

__all__ = ["per_context_rank"]


def per_context_rank(shape: ModelShape, cp: int) -> ModelShape:
    """`shape` with a sample's tokens, data and FLOPs those of one of cp ranks."""
    if cp == 1:
        return shape
    return dataclasses.replace(shape, tokens_per_sample=shape.tokens_per_sample // cp,
                               data_bytes=shape.data_bytes / cp, flops_per_sample=shape.flops_per_sample / cp)
