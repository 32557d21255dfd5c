"""The optimizer's side of a step (mixed into Engine): the loss scaler's check, clipping and the update strategy,
or the sharded optimizer's (optim/zero.py), and what the update holds in memory."""
from __future__ import annotations

import math

import torch

from hybrid_engine.optim import optimizers as optim
from hybrid_engine.optim.scaling import clip_grad_norm
from hybrid_engine.parallel.tensor.layers import is_mp_split


class UpdateStep:
    """Reads the Engine's tied gradients, sharded optimizer, scaler, update, groups and parameters."""

    def _update(self) -> tuple[torch.Tensor | None, bool, float | None]:
        """The optimizer's side of the step: (device overflow flag or None, skipped, grad norm or None).

        fp16 with an update that fuses the unscale (fused SGD + cast) and no clipping: the overflow check only
        reads the gradients, and the update applies 1/scale itself and skips itself on the device, so the host
        reads the flag only at the step's own final sync (csrc/amp/nonfinite.h). The gradient buffers then still
        hold the SCALED gradients: nothing reads them before the next step zeroes or overwrites them. Clipping
        (its norm needs unscaled gradients) and any other update (it reads .grad) unscale in place and decide on
        the host. DP replicas hold identical gradients after the all-reduce; agreeing over PP x MP makes every
        rank of every replica take the same decision. Tied copies' gradients (under ZeRO-1 their DP shards) are
        summed first."""
        if self._tied:
            self._tied.sum_grads()
        if self.zero is not None:
            return self.zero.update(self.scaler, self.precision.max_grad_norm)
        buckets = list(self.grads.buckets)
        if self.scaler is not None and self.update.fuses_unscale and self.precision.max_grad_norm <= 0:
            found_inf = self.scaler.find_nonfinite(buckets, self.groups.model_parallel, self.device)
            self.update.step(inv_scale=self.scaler.inv_scale, skip_if=found_inf)
            return found_inf, False, None
        skipped = False
        if self.scaler is not None:
            skipped = self.scaler.unscale_and_check(buckets, self.groups.model_parallel, self.device)
        grad_norm = self._clip() if not skipped and self.precision.max_grad_norm > 0 else None
        if not skipped:
            self.update.step()
        return None, skipped, grad_norm

    def master_bytes(self) -> int:
        """Bytes of fp32 master copies of half weights on this rank (under ZeRO-1 its shard of them); 0 with fp32
        weights, which are their own masters."""
        if self.zero is not None:
            return self.zero.master_bytes()
        return sum(m.numel() * m.element_size() for m in self.masters.masters) if self.masters else 0

    def optimizer_state_bytes(self) -> int:
        """Bytes of the optimizer's state tensors on this rank (under ZeRO-1 its shard of them; Adam's moments
        exist from the first step on)."""
        return optim.state_bytes(self.optimizer)

    def _clip(self) -> float:
        """Clip the global norm: MP-split gradients summed over MP, replicated ones once, a tied weight once."""
        pairs = list(zip(self._parameters, self.optimized))
        counted = [(p, o) for p, o in pairs if id(p) not in self._tied.not_counted]
        split = [o.grad for p, o in counted if is_mp_split(p)]
        replicated = [o.grad for p, o in counted if not is_mp_split(p)]
        max_norm = self.precision.max_grad_norm
        if len(counted) == len(pairs):
            return clip_grad_norm(split, replicated, max_norm, self.groups.mp, self.groups.pp, self.device)
        # A tied copy left out of the norm must still be clipped with the others: measure, then scale all (the
        # coefficient of csrc/amp/grad_clip.cpp).
        norm = clip_grad_norm(split, replicated, 0.0, self.groups.mp, self.groups.pp, self.device)
        if math.isfinite(norm) and norm > max_norm:
            torch._foreach_mul_([o.grad for _, o in pairs], max_norm / (norm + 1e-6))
        return norm
