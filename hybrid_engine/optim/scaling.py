"""Mixed precision: the fp16 loss scaler and global-norm gradient clipping.

Both live in C++ (csrc/amp/); this module picks the right one for ``--amp`` and watches for overflow.
A training step with fp16 reads::

    (loss * scaler.scale).backward()           # every micro-batch
    ... DP all-reduce of the gradients ...
    found_inf = scaler.unscale_and_check(grads, model_parallel_group)   # same answer on every rank
    if not found_inf:
        clip_grad_norm(split_grads, replicated_grads, max_norm, mp_group, pp_group)
        optimizer.step()                       # skipped steps leave weights and optimizer state untouched
    scaler.update(found_inf)
    watch.observe(scaler)

With half weights, plain SGD and no clipping the engine takes a shorter road (Engine.train_step): the check
only reads the gradients (``scaler.find_nonfinite``: a device flag, MAX-reduced over the group, no host sync),
and the fused SGD step applies 1/scale itself and skips itself on the device when the flag is set
(``sgd_step_and_cast(..., inv_scale=scaler.inv_scale, skip_if=flag)``). The host reads the flag only at the
step's own final sync; the gradient buffers keep the scaled gradients.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch
import torch.distributed as dist

import hybrid_engine._C as _C
from hybrid_engine.config.engine import PrecisionConfig

DynamicLossScaler = _C.DynamicLossScaler

DEFAULT_INIT_SCALE = 2.0**16

log = logging.getLogger(__name__)


def make_loss_scaler(
    amp: str,
    loss_scale: Optional[float] = None,
    scale_window: int = 2000,
    hysteresis: int = 1,
    min_scale: float = 1.0,
) -> Optional[DynamicLossScaler]:
    """The scaler for ``--amp``: None for off and bf16 (bf16 has fp32's range and needs none).

    fp16 scales dynamically from 2^16, unless ``loss_scale`` fixes the scale (static mode still skips steps
    whose gradients are not finite). ``hysteresis`` follows Megatron-LM: that many overflows since the last
    growth are needed before the scale backs off (1 = back off on every overflow, torch.amp.GradScaler).
    """
    PrecisionConfig(amp, loss_scale=loss_scale).validate()  # the rules of --amp and --loss-scale, said once
    if amp != "fp16":
        return None
    if loss_scale is not None:
        return DynamicLossScaler(init_scale=float(loss_scale), min_scale=0.0, static=True)
    return DynamicLossScaler(
        init_scale=DEFAULT_INIT_SCALE, growth_interval=scale_window, hysteresis=hysteresis, min_scale=min_scale
    )


def clip_grad_norm(
    split_grads: Sequence[Optional[torch.Tensor]],
    replicated_grads: Sequence[Optional[torch.Tensor]],
    max_norm: float,
    mp_group: Optional[dist.ProcessGroup] = None,
    pp_group: Optional[dist.ProcessGroup] = None,
    device: Optional[torch.device] = None,
) -> float:
    """Global L2 gradient norm of the whole model; clips in place when finite and above ``max_norm``.

    ``split_grads``: grads of parameters sharded over the MP group (summed over it); ``replicated_grads``:
    grads of parameters every MP rank holds whole (counted once). Stages are summed over ``pp_group``.
    ``max_norm <= 0`` only measures. Returns the norm before clipping; every MP and PP peer must call it.
    """
    return _C.clip_grad_norm(list(split_grads), list(replicated_grads), float(max_norm), mp_group, pp_group, device)


class OverflowWatch:
    """Warns when fp16 overflow persists: at ``threshold`` consecutive skipped steps, then every
    ``threshold`` more, so a stuck run is loud without flooding the log."""

    def __init__(self, threshold: int = 10, rank: int = 0) -> None:
        if threshold < 1:
            raise ValueError(f"overflow warning threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self.rank = rank
        self.warnings = 0

    def observe(self, scaler: DynamicLossScaler, step: Optional[int] = None) -> bool:
        """Call after ``scaler.update``; returns True when it warned this step."""
        streak = scaler.consecutive_overflows
        if streak == 0 or streak % self.threshold != 0:
            return False
        self.warnings += 1
        at = "" if step is None else f" at step {step}"
        log.warning(
            "rank %d: fp16 gradients overflowed %d steps in a row%s (loss scale %g, %d steps skipped in all); "
            "the loss or the data may hold inf/NaN, or the model may need bf16",
            self.rank, streak, at, scaler.scale, scaler.skipped_steps,
        )
        return True
