"""The course model (LargeLinearModel), a function of the seed alone (its data: data.py).

Grid invariance starts here: every layer draws its initial weights from its own generator, seeded by
(seed, layer index), on the device it will live on; the batch of step t is drawn from a generator seeded by
(seed, t). No draw depends on the grid, so every (dp, pp, mp, schedule) trains the same model on the same
numbers as one rank does. Tensor-parallel slicing happens after the full layer is drawn.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

_STREAM_LAYER = 1
_STREAM_BATCH = 2
_STREAM_TEACHER = 3
SEED_STREAMS = (_STREAM_LAYER, _STREAM_BATCH, _STREAM_TEACHER)  # the first streams the registry gives


def stream_seed(seed: int, stream: int, index: int) -> int:
    """A distinct 63-bit seed per (seed, stream, index); a fixed formula, so every rank derives the same."""
    return (seed * 1_000_003 + stream * 1_000_000_007 + index * 7_919) % (2**63 - 1)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


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


def materialize(module: nn.Module, device: torch.device | str) -> nn.Module:
    """Move a stage to its device. Modules built on the meta device are allocated there and initialised
    by their own reset_parameters(), so only this rank's layers ever exist in memory."""
    if any(p.is_meta for p in module.parameters()):
        module = module.to_empty(device=device)
        for sub in module.modules():
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()
        return module
    return module.to(device)
