"""The course model (LargeLinearModel), a function of the seed alone (its data: data.py): every layer draws its
initial weights from its own (seed, layer) generator (models/init.py), the batch of step t from one seeded by
(seed, t). Tensor-parallel slicing happens after the full layer is drawn.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from hybrid_engine.models.init import _generator, stream_seed  # noqa: F401  (_generator: re-exported for data.py)

_STREAM_LAYER = 1
_STREAM_BATCH = 2
_STREAM_TEACHER = 3
SEED_STREAMS = (_STREAM_LAYER, _STREAM_BATCH, _STREAM_TEACHER)  # the first streams the registry gives


class SeededLinear(nn.Linear):
    """nn.Linear whose reset_parameters draws from its own (seed, layer) generator on its own device,
    with nn.Linear's default bounds. Built on the meta device it costs nothing until materialized."""

    def __init__(self, dim_in: int, dim_out: int, seed: int, layer: int, device=None, dtype=None):
        self.init_seed = stream_seed(seed, _STREAM_LAYER, layer)
        super().__init__(dim_in, dim_out, bias=True, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        if self.weight.device.type == "meta":
            return
        gen = _generator(self.weight.device, self.init_seed)
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound, generator=gen)
            self.bias.uniform_(-bound, bound, generator=gen)


def large_linear_model(dim: int, depth: int, seed: int, device: torch.device | str = "meta") -> nn.Sequential:
    """The course MLP: `depth` x (Linear(dim, dim) + ReLU). Default on the meta device: the engine
    materializes only the layers of its own pipeline stage (see materialize)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [SeededLinear(dim, dim, seed, i, device=device), nn.ReLU()]
    return nn.Sequential(*layers)
