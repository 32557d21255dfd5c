"""What one optimizer step reports, the same on every rank."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepResult:
    loss: float  # mean loss over the global batch (same value on every rank)
    step_time_s: float
    skipped: bool = False  # the fp16 loss scaler found a non-finite gradient and skipped the update
    loss_scale: float | None = None
    grad_norm: float | None = None
