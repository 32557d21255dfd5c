"""The engine's workloads, each a function of the seed alone: the course MLP (mlp.py) and a GPT (gpt.py).

`from hybrid_engine.models import X` keeps working for everything models.py exported before it became a package.
"""
from __future__ import annotations

from hybrid_engine.models.mlp.model import (
    _STREAM_BATCH,
    _STREAM_LAYER,
    _STREAM_TEACHER,
    SeededLinear,
    SyntheticRegression,
    _generator,
    large_linear_model,
    materialize,
    stream_seed,
)

__all__ = [
    "SeededLinear",
    "SyntheticRegression",
    "large_linear_model",
    "materialize",
    "stream_seed",
]
