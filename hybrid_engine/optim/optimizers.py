"""Optimizers from the user, and how the engine applies them (its update strategy).

`Engine(..., optimizer=...)` takes a factory: any callable `params -> torch.optim.Optimizer`, e.g.
`lambda params: torch.optim.AdamW(params, lr=3e-4)`. `SGD`, `Adam` and `AdamW` below are factories too, as
values the engine can recognise without inspecting the optimizer it gets back: plain `SGD` (no momentum, no
weight decay) with half weights lets the engine step the fp32 masters and write the half weights in one fused
pass (csrc/optim/sgd_cast.h). The strategy is chosen once, at construction, and announced.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn as nn

from hybrid_engine.config.checks import OPTIMIZERS

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
NAMES = OPTIMIZERS  # the names --optimizer takes


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD; with momentum and weight decay 0 the engine may fuse its step with the half-weight cast."""

    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __call__(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(list(params), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    @property
    def plain(self) -> bool:
        """p -= lr * grad, nothing else: what the fused SGD + cast kernel computes."""
        return self.momentum == 0 and self.weight_decay == 0


@dataclass(frozen=True)
class Adam:
    """torch.optim.Adam (fused on CUDA)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    torch_class = torch.optim.Adam

    def __call__(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = list(params)
        return self.torch_class(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                fused=_fused(params))


@dataclass(frozen=True)
class AdamW(Adam):
    """torch.optim.AdamW (decoupled weight decay; fused on CUDA), as nanoGPT and Megatron configure it: the decay
    applies to matrices only, never to norms, biases or embeddings (`decays`). With a weight decay the tensors
    are handed over in two param groups (the second with weight_decay 0), so a distributed optimizer splits its
    flat shards where the two kinds meet (`groups_by_decay`)."""

    weight_decay: float = 0.01
    torch_class = torch.optim.AdamW

    @property
    def groups_by_decay(self) -> bool:
        return self.weight_decay > 0

    def __call__(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = list(params)
        decayed = [p for p in params if decays(p)]
        kept = [p for p in params if not decays(p)]
        groups = [g for g in ({"params": decayed}, {"params": kept, "weight_decay": 0.0}) if g["params"]]
        return self.torch_class(groups, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay,
                                fused=_fused(params))


def decays(param: torch.Tensor) -> bool:
    """Whether weight decay applies to a tensor the optimizer steps: its `no_weight_decay` tag where it has one (a
    model's embeddings; an fp32 master or a ZeRO-1 shard segment carries its parameter's), else whether it is a
    matrix (norms and biases are vectors)."""
    tag = getattr(param, "no_weight_decay", None)
    return not tag if tag is not None else param.dim() >= 2


def _fused(params: list[torch.Tensor]) -> bool | None:
    """torch's fused (one kernel per step) Adam(W) on CUDA, where it exists: a profile of the GPT-1B step showed
    the default multi-tensor AdamW at 28 ms of a 456 ms step (experiments/NOTES.md). None (torch's default) on
    the CPU, whose results the tests hold bit for bit."""
    return True if params and all(p.is_cuda and p.is_floating_point() for p in params) else None


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors (Adam's moments and step counts; nothing for plain SGD)."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if torch.is_tensor(v))


def from_name(name: str, lr: float, betas: tuple[float, float] | None = None,
              weight_decay: float | None = None) -> OptimizerFactory:
    """The command line's conveniences: sgd | adam | adamw with a learning rate, betas (adam, adamw) and a weight
    decay (adamw), torch's defaults for what is None."""
    factories = {"sgd": SGD, "adam": Adam, "adamw": AdamW}
    if name not in factories:
        raise ValueError(f"unknown optimizer '{name}' (expected one of {', '.join(NAMES)})")
    extra = {"betas": betas} if betas is not None and name != "sgd" else {}
    if weight_decay is not None and name == "adamw":
        extra["weight_decay"] = weight_decay
    return factories[name](lr=lr, **extra)


def describe(factory: OptimizerFactory) -> str:
    """A short name for announcements and checkpoint manifests: 'sgd', 'adam', 'adamw' or the callable's name."""
    if isinstance(factory, (SGD, Adam, AdamW)):
        return type(factory).__name__.lower()
    return getattr(factory, "__qualname__", type(factory).__name__)


class TorchStep:
    """The optimizer's own step on the tensors it holds (fp32 masters with half weights), then — half weights —
    the one cast of the masters to the model per step."""

    fuses_unscale = False

    def __init__(self, optimizer: torch.optim.Optimizer, masters=None):
        self.optimizer, self.masters = optimizer, masters

    def describe(self) -> str:
        cast = " + master -> half cast" if self.masters is not None else ""
        fused = "fused " if self.optimizer.defaults.get("fused") else ""
        return f"optimizer: {type(self.optimizer).__name__} ({fused}torch step{cast})"

    def step(self) -> None:
        self.optimizer.step()
        if self.masters is not None:
            self.masters.copy_to_model()


class FusedSGDCast:
    """Plain SGD on the fp32 masters fused with the cast to the half weights: one pass that reads each master once
    (14 bytes per parameter instead of 18). With fp16 it also applies 1/scale and skips itself on the device when
    the overflow flag is set, so the host never waits for the flag (csrc/optim/sgd_cast.h). The learning rate is
    read from the optimizer's param groups at every step, so LR schedulers apply."""

    fuses_unscale = True

    def __init__(self, optimizer: torch.optim.Optimizer, masters):
        self.optimizer, self.masters = optimizer, masters

    def describe(self) -> str:
        return "optimizer: SGD (fused SGD + master -> half cast, one pass per tensor)"

    def step(self, inv_scale: float = 1.0, skip_if: torch.Tensor | None = None) -> None:
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.masters.sgd_step_and_cast(lr, inv_scale=inv_scale, skip_if=skip_if)


def make_update(factory: OptimizerFactory, stepped: list[torch.Tensor], masters, device: torch.device):
    """The optimizer built from the user's factory over the tensors it steps, and the strategy that applies it —
    chosen here, once, from what the factory is (never from what it returned)."""
    params = stepped or [nn.Parameter(torch.zeros(1, device=device))]  # torch refuses an empty list
    optimizer = factory(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"the optimizer factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if masters is not None and isinstance(factory, SGD) and factory.plain:
        return optimizer, FusedSGDCast(optimizer, masters)
    return optimizer, TorchStep(optimizer, masters)
