"""How a stage computes in half precision: two implementations of `--amp fp16|bf16` (engine_config.PrecisionConfig
chooses), both kept.

autocast      fp32 weights; torch.autocast casts them to half inside every matrix product, i.e. once per
              micro-batch and layer (what the course asks for). Gradients accumulate in fp32 .grad.
half-weights  the stage's weights live in half precision for the whole step, next to an fp32 master copy that
              the optimizer updates; the cast happens once per optimizer step. Weight gradients accumulate in
              fp32 "main grad" buffers, written by one GEMM with half inputs and fp32 output per layer
              (csrc/grad/grad_buffer.h), so summing micro-batches never rounds to half precision.
"""
from __future__ import annotations

import torch
import torch.nn as nn

import hybrid_engine._C as _C
from hybrid_engine.parallel.tensor.layers import copy_placement


class MasterWeights:
    """fp32 master copies of half-precision stage weights; the optimizer steps the masters."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.masters = [nn.Parameter(p.detach().float().clone()) for p in params]
        for master, param in zip(self.masters, params):
            copy_placement(param, master)
            if hasattr(param, "no_weight_decay"):  # what AdamW decays is the model's call (optimizers.decays)
                master.no_weight_decay = param.no_weight_decay

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The one cast per optimizer step: fp32 masters -> half weights."""
        if self.params:
            torch._foreach_copy_(self.params, self.masters)

    @torch.no_grad()
    def sgd_step_and_cast(self, lr: float, inv_scale: float = 1.0, skip_if: torch.Tensor | None = None) -> None:
        """Plain SGD on the masters (master -= lr * master.grad) fused with the cast to the model weights:
        one pass that reads each master once (csrc/optim/sgd_cast.h). Masters without a gradient keep
        their value, as with torch.optim.SGD.

        fp16 loss scaling: the step uses grad * inv_scale (rounded in fp32, as torch's AMP unscale would
        leave it) without writing the gradients, and a nonzero `skip_if` (a float32 [1] tensor on the
        masters' device, e.g. DynamicLossScaler.find_nonfinite's flag) skips it on the device: nothing is
        written and the host never waits for the flag."""
        stepped = [(m, m.grad, p) for m, p in zip(self.masters, self.params) if m.grad is not None]
        if stepped:
            masters, grads, params = map(list, zip(*stepped))
            _C.sgd_step_and_cast(masters, grads, params, lr, inv_scale=inv_scale, skip_if=skip_if)
