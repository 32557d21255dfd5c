"""Losses as values: what the last pipeline stage computes on each micro-batch.

`Engine(model, loss, ...)` takes either a built-in loss from this module, which the engine runs in C++ and the
native stage program fuses (the output's gradient computed together with the loss, no Python on the last stage's
critical path, no per-row memory), or any callable `(output, target) -> scalar mean loss of the micro-batch`,
which runs through autograd. The engine never inspects a callable to guess what it is: pass `MSE()` to get the
fused path, and the choice is announced at start-up either way.

A loss that needs the engine's process groups is a value too: `VocabParallelCrossEntropy(vocab_size)` (a GPT's
next-token loss over logits split along the vocabulary over MP). The engine turns any loss spec into the callable
its executor calls with `bind(loss, groups)`, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

from hybrid_engine.kernels.linear_cross_entropy import LinearCrossEntropy
from hybrid_engine.parallel.tensor.vocab_cross_entropy import vocab_parallel_cross_entropy

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class MSE:
    """Mean squared error in fp32 (bit for bit `F.mse_loss(output.float(), target.float())`), computed in C++
    (csrc/executor/mse_loss.h)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output.float(), target.float())


@dataclass(frozen=True)
class VocabParallelCrossEntropy:
    """Mean next-token cross-entropy over all tokens of a micro-batch: output = this MP rank's logits shard
    [b, s, V'/mp] (V' = vocab_size padded to a multiple of mp), target = int64 token ids [b, s]
    (parallel/tensor/vocab_cross_entropy.py: the logits are never gathered, max and sum of exp are reduced
    over MP, padding columns never count). The logits go in as they are (bf16 stays bf16): the loss computes in
    fp32 itself, so no full fp32 copy of the logits is made before it. Needs the engine's MP group: see `bind`."""

    vocab_size: int

    def __post_init__(self) -> None:
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"VocabParallelCrossEntropy: vocab_size must be a positive integer, got "
                             f"{self.vocab_size!r}")


LossSpec = Union[MSE, VocabParallelCrossEntropy, LinearCrossEntropy, LossFn]


def is_builtin(loss: LossSpec) -> bool:
    return isinstance(loss, MSE)


def bind(loss: LossSpec, groups, last_stage=None) -> LossFn:
    """The callable (output, target) -> scalar the executor calls on the last stage for a non-built-in loss:
    a loss spec that needs process groups gets this rank's (`groups`: grid.GridGroups), the fused linear +
    cross-entropy also the head of `last_stage` (this rank's last stage, None where it holds none); a plain
    callable gets the fp32 cast of `as_micro_loss`."""
    if isinstance(loss, LinearCrossEntropy):
        return loss.bind(groups, last_stage)
    if isinstance(loss, VocabParallelCrossEntropy):
        mp_group, vocab_size = groups.mp, loss.vocab_size

        def vocab_parallel_ce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return vocab_parallel_cross_entropy(output, target, mp_group, vocab_size)

        return vocab_parallel_ce
    return as_micro_loss(loss)


def as_micro_loss(loss: LossSpec) -> LossFn:
    """A plain callable loss as the executor calls it: in fp32 whatever the stage's output dtype (half weights).
    Loss specs that compute in fp32 themselves (VocabParallelCrossEntropy) are not cast: use `bind`."""
    if isinstance(loss, (VocabParallelCrossEntropy, LinearCrossEntropy)):
        raise TypeError(f"{type(loss).__name__} needs the engine's MP group: use losses.bind(loss, groups)")
    if not callable(loss):
        raise TypeError(f"loss must be hybrid_engine.models.losses.MSE(), VocabParallelCrossEntropy(vocab_size) or a "
                        f"callable (output, target) -> scalar, got {type(loss).__name__}")

    def micro_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if output.is_floating_point() and output.dtype != torch.float32:
            output = output.float()
        if target.is_floating_point() and target.dtype != torch.float32:
            target = target.float()
        return loss(output, target)

    return micro_loss


def describe(loss: LossSpec, native_last_stage: bool = False) -> str:
    """The loss line rank 0 prints; whether the last stage runs natively decides where the built-in MSE's
    gradient comes from (csrc/executor/step_loss.h)."""
    if is_builtin(loss):
        where = ("its gradient computed with the loss, no graph kept" if native_last_stage else
                 "a graph root for the autograd last stage")
        return f"built-in {type(loss).__name__} (C++, {where})"
    if isinstance(loss, VocabParallelCrossEntropy):
        return (f"vocab-parallel cross-entropy over {loss.vocab_size} tokens (fp32 inside, logits never gathered, "
                "through autograd)")
    if isinstance(loss, LinearCrossEntropy):
        return loss.describe()
    name = getattr(loss, "__qualname__", None) or type(loss).__name__
    return f"Python callable {name} (through autograd)"
