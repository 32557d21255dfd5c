"""The divergence guard: which losses stop training, and so which checkpoints may become `latest`.

A step's loss is computed from the state the previous step left, so it is the first evidence that this state is
sound. A loss that is not finite, or a spike (more than `factor` times the largest of the last `window` losses:
Megatron's rerun machinery flags a loss 10x over its recent ones), means an update diverged. The trainer stops
there, and a checkpoint of state N is published as `latest` only after step N's loss passed this check: so the
checkpoint `latest` names is always one from which `--resume` with a smaller learning rate trains on.

The loss is all-reduced before it reaches the guard, so every rank reaches the same verdict at the same step
without a collective of its own.
"""
from __future__ import annotations

import math
from collections import deque

WINDOW = 20


class DivergenceGuard:
    """Remembers this run's last `window` accepted losses; `problem` judges the next one."""

    def __init__(self, factor: float = 10.0, window: int = WINDOW):
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def problem(self, step: int, loss: float) -> str | None:
        """Why `loss`, the loss of step `step`, must stop training (None: it may go on)."""
        if not math.isfinite(loss):
            return f"loss is {'NaN' if math.isnan(loss) else loss} at step {step}"
        if self.factor and self.recent and max(self.recent) > 0 and loss > self.factor * max(self.recent):
            return (f"loss {loss:.6g} at step {step} is more than {self.factor:g}x the largest of the "
                    f"{len(self.recent)} before it ({max(self.recent):.6g}): a spike")
        return None

    def accept(self, loss: float) -> None:
        self.recent.append(loss)
