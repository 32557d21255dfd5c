"""What a run chooses for the course MLP: its [model] keys and their flags (config/fields.py makes the flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hybrid_engine.config.engine import ConfigError

MAX_DIM = 2**16  # one dim x dim fp32 layer is then 16 GiB
MAX_DEPTH = 4096


@dataclass(frozen=True)
class MLPOptions:
    """The course MLP: depth x [Linear(dim, dim) + ReLU] against a fixed random teacher."""

    # Without --optimizer / --lr. The MSE averages over the rows and the dim outputs, so a weight's gradient is
    # small: at lr 0.01 the default run's loss only wanders (0.299 -> 0.294 in 10 steps); at 10 it falls to 0.236
    # in 10 steps and to ~0.20 in 20, and stays stable from dim 4 to 1024, in fp32 and bf16.
    OPTIMIZER: ClassVar[tuple[str, float]] = ("sgd", 10.0)

    dim: int = 1024
    """MLP: hidden size of every Linear layer."""
    depth: int = 8
    """MLP: number of Linear + ReLU blocks."""

    def check(self) -> None:
        """Each number in range, before anything is built (a huge --dim would fail deep in torch after setup)."""
        if self.dim < 1 or self.depth < 1:
            raise ConfigError(f"--dim and --depth must be >= 1, got dim {self.dim}, depth {self.depth}")
        if self.dim > MAX_DIM:
            raise ConfigError(f"--dim {self.dim} is too large (at most {MAX_DIM}: one {MAX_DIM} x {MAX_DIM} fp32 layer "
                              "is already 16 GiB)")
        if self.depth > MAX_DEPTH:
            raise ConfigError(f"--depth {self.depth} is too large (at most {MAX_DEPTH} layers)")
