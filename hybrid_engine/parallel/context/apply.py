"""A stage made context-parallel from outside, after its tensor-parallel plan: every block's attention and every
position lookup asks this rank's ContextParallel (the models read `context_parallel`, None without cp)."""
from __future__ import annotations

import torch
import torch.nn as nn

from .attention import ContextParallel

__all__ = ["ContextRows", "apply_context_parallel", "context_of"]


def context_of(groups, rule, trace=None, kernel: str = "auto") -> ContextParallel | None:
    """This rank's ContextParallel on the grid's cp group (None while cp = 1); rule: which transfers its attention
    runs (ContextParallel.rule); trace: the engine's _C.CommTrace, which then records every transfer (None:
    untraced); kernel: the blocks' (ContextParallel.kernel)."""
    if groups.cp is None:
        return None
    return ContextParallel.of_group(groups.cp, groups.grid.group_of(groups.rank, "cp"), rule, trace, kernel)


class ContextRows(nn.Module):
    """rows(table, s): the rows of this rank's global positions, then what the wrapped lookup takes of them (all,
    or its sequence-parallel chunk)."""

    def __init__(self, inner: nn.Module, context: ContextParallel):
        super().__init__()
        self.inner, self.context = inner, context

    def forward(self, table: torch.Tensor, length: int) -> torch.Tensor:
        return self.inner(table.index_select(0, self.context.positions(length, table.device)), length)


def apply_context_parallel(stage: nn.Module, context: ContextParallel | None) -> nn.Module:
    """`stage` with its blocks' attention and its position lookups context-parallel (in place; None: as it is)."""
    if context is None:
        return stage
    for module in list(stage.modules()):
        if hasattr(module, "context_parallel"):
            module.context_parallel = context
        if isinstance(getattr(module, "positions", None), nn.Module) and not isinstance(module.positions, ContextRows):
            module.positions = ContextRows(module.positions, context)
    return stage
