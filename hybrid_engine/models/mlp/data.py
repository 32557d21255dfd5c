"""The course MLP's data: regression onto a fixed random teacher, the batch of step t drawn from (seed, t) alone, so
every grid trains on the same numbers."""
from __future__ import annotations

import torch

from .model import _STREAM_BATCH, _STREAM_TEACHER, _generator, stream_seed


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
