"""The learning rate of every step: linear warm-up, then cosine, linear or no decay to a floor, as nanoGPT and
Megatron schedule it. A function of the global step alone, the step a checkpoint restores, so a resumed run (on
any grid) continues the very curve of the run it resumes; a step the fp16 loss scaler skips still counts, as in
nanoGPT and torchtitan. The manifest records the schedule (`as_dict`), and a run that resumes with another one
says so before its first step.

    lr(t) = lr (t + 1) / warmup                                  t < warmup
          = min + (lr - min) c(p),  p = (t - warmup) / (decay_steps - warmup)   warmup <= t < decay_steps
          = min                                                  t >= decay_steps (cosine and linear)
    c(p) = (1 + cos(pi p)) / 2 (cosine), 1 - p (linear), 1 (constant)
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hybrid_engine.config.checks import LR_DECAYS


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    warmup: int = 0
    decay: str = "constant"
    min_lr: float = 0.0
    decay_steps: int = 0  # where cosine and linear reach min_lr (unused by constant)

    def __post_init__(self) -> None:
        if self.decay not in LR_DECAYS:
            raise ValueError(f"lr decay must be one of {', '.join(LR_DECAYS)}, got {self.decay!r}")

    @staticmethod
    def of(optimizer, steps: int) -> "LRSchedule":
        """The schedule of a run's [optimizer] table (config/run.py OptimizerConfig) and its --steps."""
        constant = optimizer.lr_decay == "constant"
        return LRSchedule(optimizer.lr, optimizer.lr_warmup, optimizer.lr_decay,
                          0.0 if constant else optimizer.min_lr,
                          0 if constant else (optimizer.lr_decay_steps if optimizer.lr_decay_steps is not None
                                              else steps))

    def at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.decay == "constant":
            return self.lr
        if step >= self.decay_steps:
            return self.min_lr
        progress = (step - self.warmup) / (self.decay_steps - self.warmup)
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1.0 - progress
        return self.min_lr + coeff * (self.lr - self.min_lr)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        warm = f"{self.warmup} warm-up steps, then " if self.warmup else ""
        if self.decay == "constant":
            return f"lr {self.lr:g}{' after ' + str(self.warmup) + ' warm-up steps' if self.warmup else ''}"
        return f"lr {self.lr:g}: {warm}{self.decay} decay to {self.min_lr:g} at step {self.decay_steps}"
