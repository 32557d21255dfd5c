"""A step's data on one rank, as the executor asks for it: micro-batch by micro-batch, from a whole slice or from a
callable that draws each one when its forward runs."""
from __future__ import annotations

from typing import Callable

import torch

# A step's data on one rank: the whole slice, a callable micro -> that micro-batch, or None (not consumed here).
MicroBatches = torch.Tensor | Callable[[int], torch.Tensor] | None


def micro_batch_fn(data: MicroBatches, micro_batches: int, dtype: torch.dtype | None,
                   what: str) -> Callable[[int], torch.Tensor]:
    """micro -> that micro-batch (floating data in `dtype` when given), from a callable or a whole slice."""
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    if callable(data):
        def fetch(micro: int) -> torch.Tensor:
            batch = data(micro)
            if not isinstance(batch, torch.Tensor):
                raise TypeError(f"{what}({micro}) must return a tensor, got {type(batch).__name__}")
            return cast(batch)
        return fetch
    chunks = cast(data).chunk(micro_batches)
    return lambda micro: chunks[micro]
