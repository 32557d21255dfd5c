"""Stage programs: how each pipeline stage computes, chosen once per stage and announced.

Two implementations of one interface (csrc/executor/stage_program.h), which the executor drives alike:

  native    a chain of Linear (+ ReLU) layers that C++ runs without autograd: no graph, the backward on the
            executor's thread, and with the built-in MSE on the last stage the output's gradient computed
            together with the loss. The fast path for the course MLP.
  autograd  any nn.Module, called through Python; its backward is torch's autograd. Autocast (amp
            implementation "autocast"), activation recomputation (torch.utils.checkpoint) and, where asked,
            torch.compile run inside it. Its first module may take integer tokens and its last may produce
            logits.

`StageConfig.impl` picks: "auto" takes native wherever the stage is such a chain (and autocast is off, which must
see the modules), "native" requires it everywhere, "autograd" never takes it. The plan depends only on the model's
structure, so every rank derives the same plan for all stages without a collective, and rank 0 prints it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.utils.checkpoint

from . import _C
from .engine_config import ConfigError, PrecisionConfig, StageConfig
from .param_gather import ForwardWaits
from .tp_layers import Linear


@dataclass(frozen=True)
class StagePlan:
    stage: int
    native: bool
    layers: int  # modules with parameters
    why: str  # for an autograd stage: why it is not native (empty for native)

    def describe(self, stage_cfg: StageConfig) -> str:
        if self.native:
            return f"stage {self.stage}: native Linear(+ReLU) chain, {self.layers} layers" + (
                ", recomputed" if stage_cfg.recompute else "")
        extras = [e for e, on in (("recomputed", stage_cfg.recompute), ("torch.compile", stage_cfg.compile)) if on]
        return (f"stage {self.stage}: autograd, {self.layers} layers ({self.why})"
                + (f", {', '.join(extras)}" if extras else ""))


def chain_relu_flags(stage: nn.Sequential) -> list[bool] | None:
    """Per layer, whether a ReLU follows it, if the stage is a plain chain of Linear layers (torch's or ours, not
    tensor-parallel), each optionally followed by one ReLU; else None."""
    relu: list[bool] = []
    for module in stage:
        if isinstance(module, (nn.Linear, Linear)):  # what parallelize_mlp turns into our Linear
            relu.append(False)
        elif type(module) is nn.ReLU and relu and not relu[-1] and not module.inplace:
            relu[-1] = True
        else:
            return None
    return relu or None


def plan_stages(model: nn.Sequential, layout: list[list[int]], mp_size: int, precision: PrecisionConfig,
                stage_cfg: StageConfig) -> list[StagePlan]:
    """The program every stage gets, from the (possibly meta) whole model: the same on every rank."""
    plans = []
    for s, indices in enumerate(layout):
        modules = nn.Sequential(*[model[i] for i in indices])
        layers = sum(1 for m in modules if any(True for _ in m.parameters()))
        if stage_cfg.impl == "autograd":
            why = "stage implementation autograd"
        elif precision.autocast:
            why = "autocast must see the modules"
        elif mp_size > 1:
            why = "tensor-parallel layers"
        elif chain_relu_flags(modules) is None:
            kinds = sorted({type(m).__name__ for m in modules if not isinstance(m, (nn.Linear, Linear, nn.ReLU))})
            why = f"not a Linear(+ReLU) chain: {', '.join(kinds) or 'ReLU placement'}"
        else:
            why = ""
        if stage_cfg.impl == "native" and why:
            raise ConfigError(f"stage implementation native: stage {s} cannot run natively ({why}); use auto or "
                              "autograd")
        plans.append(StagePlan(s, not why, layers, why))
    return plans


def native_program(stage: nn.Sequential, recompute: bool, grads: _C.GradBuffer,
                   param_gather: _C.DpParamGather | None = None) -> _C.NativeChainStage:
    params: list[torch.Tensor | None] = []
    for module in stage:
        if isinstance(module, (nn.Linear, Linear)):
            params += [module.weight, module.bias]
    return _C.NativeChainStage(params, chain_relu_flags(stage), recompute, grads, param_gather)


def autograd_forward(stage: nn.Module, precision: PrecisionConfig, device: torch.device, stage_cfg: StageConfig,
                     before: Callable[[], None] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The stage's forward as the autograd program calls it: under autocast when asked, through torch.compile
    when asked, and with recomputation keeping only the stage input (torch's non-reentrant checkpoint).
    before: called first, outside the compiled region (a compiled stage's wait for its ZeRO-1 parameters)."""
    module = torch.compile(stage) if stage_cfg.compile else stage
    context = ((lambda: torch.autocast(device.type, dtype=precision.half_dtype)) if precision.autocast
               else contextlib.nullcontext)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if before is not None:
            before()
        with context():
            if stage_cfg.recompute and torch.is_grad_enabled():
                return torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False)
            return module(x)

    return forward


def build_programs(plans: list[StagePlan], stages: dict[int, nn.Sequential], precision: PrecisionConfig,
                   stage_cfg: StageConfig, device: torch.device, grads: _C.GradBuffer,
                   waits: ForwardWaits | None = None) -> dict[int, object]:
    """This rank's stage programs, {stage: _C.StageProgram}. waits (ZeRO-1 with the parameter all-gather
    overlapped): every layer waits for its parameters' gather just before its forward (hybrid_engine/param_gather.py)."""
    programs = {}
    for s, stage in stages.items():
        plan = plans[s]
        if plan.native:
            programs[s] = native_program(stage, stage_cfg.recompute, grads, waits.gather if waits else None)
            continue
        before = None
        if waits is not None and stage_cfg.compile:
            before = waits.stage_waiter(stage)
        elif waits is not None:
            waits.hook_layers(stage)
        programs[s] = _C.AutogradStage(autograd_forward(stage, precision, device, stage_cfg, before),
                                       plan.describe(stage_cfg))
    return programs
