"""Losses as values: what the last pipeline stage computes on each micro-batch.

`Engine(model, loss, ...)` takes either a built-in loss from this module, which the engine runs in C++ and the
native stage program fuses (the output's gradient computed together with the loss, no Python on the last stage's
critical path, no per-row memory), or any callable `(output, target) -> scalar mean loss of the micro-batch`,
which runs through autograd. The engine never inspects a callable to guess what it is: pass `MSE()` to get the
fused path, and the choice is announced at start-up either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MSE:
    """Mean squared error in fp32 (bit for bit `F.mse_loss(output.float(), target.float())`), computed in C++
    (csrc/executor/mse_loss.h)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output.float(), target.float())


LossSpec = Union[MSE, LossFn]


def is_builtin(loss: LossSpec) -> bool:
    return isinstance(loss, MSE)


def as_micro_loss(loss: LossSpec) -> LossFn:
    """A callable loss as the executor calls it: in fp32 whatever the stage's output dtype (half weights)."""
    if not callable(loss):
        raise TypeError(f"loss must be hybrid_engine.losses.MSE() or a callable (output, target) -> scalar, got "
                        f"{type(loss).__name__}")

    def micro_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if output.is_floating_point() and output.dtype != torch.float32:
            output = output.float()
        if target.is_floating_point() and target.dtype != torch.float32:
            target = target.float()
        return loss(output, target)

    return micro_loss


def describe(loss: LossSpec) -> str:
    if is_builtin(loss):
        return f"built-in {type(loss).__name__} (C++, fused with a native last stage)"
    name = getattr(loss, "__qualname__", None) or type(loss).__name__
    return f"Python callable {name} (through autograd)"
