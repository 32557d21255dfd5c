"""The course model (LargeLinearModel) and its synthetic data, both functions of the seed alone.

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


class SyntheticRegression:
    """Inputs x ~ N(0, 1) and targets from a fixed random teacher, y = relu(a * x + b) per feature.

    The teacher is elementwise so that a target costs nothing next to the model's matrix products even
    at 16k-row batches; the MLP can represent it, so the loss really falls.
    """

    def __init__(self, dim: int, seed: int, device: torch.device | str):
        self.dim = dim
        self.seed = seed
        self.device = torch.device(device)
        gen = _generator(self.device, stream_seed(seed, _STREAM_TEACHER, 0))
        self.scale = torch.empty(dim, device=self.device).uniform_(-1.0, 1.0, generator=gen)
        self.shift = torch.empty(dim, device=self.device).uniform_(0.0, 0.5, generator=gen)

    # Rows are drawn in blocks, each from its own (seed, step, block) generator: any row range can be drawn
    # alone (a DP rank draws only its slice, a middle pipeline stage nothing) and equals the same rows of the
    # whole batch, whatever the grid.
    ROW_BLOCK = 256

    def _blocks(self, step: int, start: int, stop: int):
        """(rows [start, stop) of each block, as a fresh fp32 tensor, offset of those rows in the range)."""
        for block in range(start // self.ROW_BLOCK, (stop - 1) // self.ROW_BLOCK + 1):
            gen = _generator(self.device, stream_seed(self.seed, _STREAM_BATCH, step * 1_000_003 + block))
            rows = torch.randn(self.ROW_BLOCK, self.dim, device=self.device, generator=gen)
            lo = max(start - block * self.ROW_BLOCK, 0)
            hi = min(stop - block * self.ROW_BLOCK, self.ROW_BLOCK)
            yield rows[lo:hi], block * self.ROW_BLOCK + lo - start

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(inputs, targets) of rows [start, stop) of step `step`'s global batch, each only if asked for (else
        None), in `dtype`. Memory-lean: each output is allocated once at its final size and dtype and filled
        block by block (a block is drawn, and its targets computed, in fp32, then cast into place), so no
        full-size fp32 copy ever exists and targets never need the full inputs. The values equal
        `batch(step, ...)`'s fp32 tensors cast with `.to(dtype)`, bit for bit."""
        if stop <= start:
            raise ValueError(f"empty row range [{start}, {stop})")
        x = torch.empty(stop - start, self.dim, device=self.device, dtype=dtype) if inputs else None
        y = torch.empty(stop - start, self.dim, device=self.device, dtype=dtype) if targets else None
        for rows, at in self._blocks(step, start, stop):
            if x is not None:
                x[at : at + len(rows)].copy_(rows)
            if y is not None:
                y[at : at + len(rows)].copy_(self.targets(rows))
        return x, y

    def inputs(self, step: int, start: int, stop: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows [start, stop) of step `step`'s global batch."""
        return self.draw(step, start, stop, targets=False, dtype=dtype)[0]

    def targets_of(self, step: int, start: int, stop: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The targets of rows [start, stop) of step `step`'s global batch, without keeping the inputs (a last
        pipeline stage needs only these)."""
        return self.draw(step, start, stop, inputs=False, dtype=dtype)[1]

    def targets(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.relu(inputs * self.scale + self.shift)

    def batch(self, step: int, batch_size: int, start: int = 0, stop: int | None = None,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of rows [start, stop) (default: all) of a global batch of `batch_size` rows.
        The targets come from the fp32 inputs; with another `dtype` both are then cast (see `draw`)."""
        stop = batch_size if stop is None else stop
        return self.draw(step, start, stop, dtype=dtype)
