"""Seeded initial weights, for every model: the seed of each (seed, stream, index) draw, its generator, and
`materialize`, which gives a stage built on the meta device its memory and its weights.

Grid invariance starts here: every layer draws its initial weights from its own generator, seeded by (seed,
layer index), on the device it will live on, and always draws its full tensors; a layer split over the MP group
keeps its rank's slice of them (parallel/tensor/full_weights.py). No draw depends on the grid, so every
(dp, pp, mp, schedule) trains the same model on the same numbers as one rank does.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from hybrid_engine.parallel.tensor.full_weights import load_full

__all__ = ["stream_seed", "materialize", "init_layer"]


def stream_seed(seed: int, stream: int, index: int) -> int:
    """A distinct 63-bit seed per (seed, stream, index); a fixed formula, so every rank derives the same."""
    return (seed * 1_000_003 + stream * 1_000_000_007 + index * 7_919) % (2**63 - 1)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def init_layer(layer: nn.Module) -> None:
    """Give a layer that draws its own weights (it has `full_weights(device, dtype)`, a dict of full tensors by
    parameter name) those weights, each parameter keeping its rank's slice when it is split over MP, and its
    derived buffers (`reset_buffers`, where it has one)."""
    first = next(layer.parameters())
    if first.device.type == "meta":
        return
    load_full(layer, layer.full_weights(first.device, first.dtype))
    if hasattr(layer, "reset_buffers"):
        layer.reset_buffers()


def _initialise(module: nn.Module) -> None:
    """A layer with `full_weights` draws its own (its sub-modules draw nothing); else `reset_parameters`; else
    the same for each child."""
    if hasattr(module, "full_weights"):
        init_layer(module)
    elif hasattr(module, "reset_parameters"):
        module.reset_parameters()
    else:
        for child in module.children():
            _initialise(child)


def materialize(module: nn.Module, device: torch.device | str, dtype: torch.dtype | None = None) -> nn.Module:
    """Move a stage to its device (and, given `dtype`, its floating tensors to that dtype). Modules built on the
    meta device are allocated there and initialised from their own generators, so only this rank's layers (and of
    a split layer only its slices, when the stage was parallelized on the meta device) ever exist in memory. A
    Sequential is built layer by layer, each converted to `dtype` before the next is allocated: a half-precision
    stage holds at most one layer's float32 draw, never a float32 copy of itself. Parameters keep their tags
    (placement, tied, weight decay): `to_empty` makes new Parameters."""
    if not any(p.is_meta for p in module.parameters()):
        module = module.to(device)
        return module.to(dtype) if dtype is not None else module
    for part in (list(module.children()) if isinstance(module, nn.Sequential) else [module]):
        tags = {name: dict(p.__dict__) for name, p in part.named_parameters()}
        part.to_empty(device=device)
        for name, p in part.named_parameters():
            p.__dict__.update(tags[name])
        _initialise(part)
        if dtype is not None:
            part.to(dtype)
    return module
