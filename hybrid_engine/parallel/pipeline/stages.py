"""Stage programs: how each pipeline stage computes, chosen once per stage and announced.

Two implementations of one interface (csrc/executor/stage_program.h), which the executor drives alike:

  native    a chain of Linear (+ ReLU) layers that C++ runs without autograd: no graph, the backward on the
            executor's thread, and with the built-in MSE on the last stage the output's gradient computed
            together with the loss. The fast path for the course MLP. With mp > 1 the same chain runs split
            Megatron-style (parallelize_mlp's column/row pairs), its MP all-reduces asynchronous and overlapped
            with the GEMMs of the next row chunk (csrc/tp/linear_chain.h).
  autograd  any nn.Module, called through Python; its backward is torch's autograd. Autocast (amp
            implementation "autocast"), activation recomputation (torch.utils.checkpoint) and, where asked,
            torch.compile run inside it. Its first module may take integer tokens and its last may produce
            logits.

`StageConfig.impl` picks: "auto" takes native wherever the stage is such a chain (and autocast is off, which must
see the modules; with mp > 1, the model's tensor-parallel function must be parallelize_mlp, whose layers the
chain knows), "native" requires it everywhere, "autograd" never takes it. The plan depends only on the model's
structure, so every rank derives the same plan for all stages without a collective, and rank 0 prints it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.utils.checkpoint

import hybrid_engine._C as _C
from hybrid_engine.config.engine import ConfigError, PrecisionConfig, StageConfig
from hybrid_engine.parallel.data_parallel.param_gather import ForwardWaits
from hybrid_engine.parallel.tensor.layers import ColumnParallelLinear, Linear, RowParallelLinear

# The kind of each layer of a native chain (csrc/tp/linear_chain.h: LayerKind).
DENSE, COLUMN, ROW, COLUMN_GATHER = range(4)


@dataclass(frozen=True)
class StagePlan:
    stage: int
    native: bool
    layers: int  # modules with parameters (a native chain's Linear layers)
    why: str  # for an autograd stage: why it is not native (empty for native)
    mp: int = 1  # the MP size a native chain is split over
    modules: int = 0  # every module of the stage, as the cut line above it counts them (balance.describe_layout)

    def describe(self, stage_cfg: StageConfig) -> str:
        """The program line rank 0 prints under the cut lines: a native chain counts its Linear layers (each
        with the ReLU after it), an autograd stage the modules it calls."""
        if self.native:
            what = "Linear(+ReLU) chain" if self.mp == 1 else f"tensor-parallel Linear(+ReLU) chain, mp {self.mp}"
            chunks = ("" if self.mp == 1 or stage_cfg.tp_chunks <= 1 else f", {stage_cfg.tp_chunks} row chunks")
            return f"stage {self.stage}: native {what}, {self.layers} Linear layer{'' if self.layers == 1 else 's'}{chunks}" + (
                ", recomputed" if stage_cfg.full_recompute else "")
        extras = [e for e, on in (("recomputed", stage_cfg.full_recompute), (
            "torch.compile (weight gradients through autograd's accumulation, never deferred)", stage_cfg.compile)) if on]
        return (f"stage {self.stage}: autograd, {self.modules} module{'' if self.modules == 1 else 's'} ({self.why})"
                + (f", {', '.join(extras)}" if extras else ""))


CHAIN_LINEARS = (nn.Linear, Linear, ColumnParallelLinear, RowParallelLinear)


def chain_relu_flags(stage: nn.Sequential) -> list[bool] | None:
    """Per layer, whether a ReLU follows it, if the stage is a plain chain of Linear layers (torch's, or ours:
    plain or tensor-parallel), each optionally followed by one ReLU; else None."""
    relu: list[bool] = []
    for module in stage:
        if isinstance(module, CHAIN_LINEARS):
            relu.append(False)
        elif type(module) is nn.ReLU and relu and not relu[-1] and not module.inplace:
            relu[-1] = True
        else:
            return None
    return relu or None


def plan_stages(model: nn.Sequential, layout: list[list[int]], mp_size: int, precision: PrecisionConfig,
                stage_cfg: StageConfig, tp_chains: bool = True) -> list[StagePlan]:
    """The program every stage gets, from the (possibly meta) whole model: the same on every rank.
    tp_chains: with mp > 1, the stages are split by parallelize_mlp (whose column/row pairs a native chain runs);
    any other tensor-parallel function's layers go through autograd."""
    plans = []
    for s, indices in enumerate(layout):
        modules = nn.Sequential(*[model[i] for i in indices])
        layers = sum(1 for m in modules if any(True for _ in m.parameters()))
        if stage_cfg.impl == "autograd":
            why = "stage implementation autograd"
        elif precision.autocast:
            why = "autocast must see the modules"
        elif mp_size > 1 and not tp_chains:
            why = "tensor-parallel layers of the model's own parallelize function"
        elif chain_relu_flags(modules) is None:
            kinds = sorted({type(m).__name__ for m in modules if not isinstance(m, (nn.Linear, Linear, nn.ReLU))})
            why = f"not a Linear(+ReLU) chain: {', '.join(kinds) or 'ReLU placement'}"
        else:
            why = ""
        if stage_cfg.impl == "native" and why:
            raise ConfigError(f"stage implementation native: stage {s} cannot run natively ({why}); use auto or "
                              "autograd")
        plans.append(StagePlan(s, not why, layers, why, mp_size, len(indices)))
    return plans


def chain_kind(module: nn.Module) -> int:
    """A chain layer's kind: how its weight is split over the MP group, and so which collectives it runs."""
    if isinstance(module, ColumnParallelLinear) and module.mp_size > 1:
        return COLUMN_GATHER if module.gather_output else COLUMN
    if isinstance(module, RowParallelLinear) and module.mp_size > 1:
        return ROW
    return DENSE


def native_program(stage: nn.Sequential, stage_cfg: StageConfig, grads: _C.GradBuffer, mp_group=None,
                   param_gather: _C.DpParamGather | None = None, comm_trace=None) -> _C.NativeChainStage:
    """The C++ program of a chain stage (plain, or tensor-parallel over mp_group)."""
    linears = [m for m in stage if isinstance(m, CHAIN_LINEARS)]
    params = [t for m in linears for t in (m.weight, m.bias)]
    kinds = [chain_kind(m) for m in linears]
    return _C.NativeChainStage(params, chain_relu_flags(stage), stage_cfg.full_recompute, grads, param_gather,
                               kinds=kinds, mp_group=mp_group if any(kinds) else None, chunks=stage_cfg.tp_chunks,
                               trace=comm_trace)


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
            if stage_cfg.full_recompute and torch.is_grad_enabled():
                return torch.utils.checkpoint.checkpoint(module, x, use_reentrant=False)
            return module(x)

    return forward


def build_programs(plans: list[StagePlan], stages: dict[int, nn.Sequential], precision: PrecisionConfig,
                   stage_cfg: StageConfig, device: torch.device, grads: _C.GradBuffer,
                   waits: ForwardWaits | None = None, mp_group=None, comm_trace=None) -> dict[int, object]:
    """This rank's stage programs, {stage: _C.StageProgram}. waits (ZeRO-1 with the parameter all-gather
    overlapped): every layer waits for its parameters' gather just before its forward (hybrid_engine/parallel/data_parallel/param_gather.py).
    mp_group: the group tensor-parallel chains run their collectives on; comm_trace: where they are recorded."""
    programs = {}
    for s, stage in stages.items():
        plan = plans[s]
        if plan.native:
            programs[s] = native_program(stage, stage_cfg, grads, mp_group, waits.gather if waits else None,
                                         comm_trace)
            continue
        before = None
        if waits is not None and stage_cfg.compile:
            before = waits.stage_waiter(stage)
        elif waits is not None:
            waits.hook_layers(stage)
        programs[s] = _C.AutogradStage(autograd_forward(stage, precision, device, stage_cfg, before),
                                       plan.describe(stage_cfg))
    return programs
