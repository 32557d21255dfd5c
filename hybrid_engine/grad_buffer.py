"""The engine's gradient buffer: flat DP buckets laid out once, each gradient a view into one of them.

Backward (autograd, the native chains, the W flushes) accumulates straight into what the DP collective sends: no
copy in, no copy out. With half weights the optimizer's fp32 masters own the views, and the C++ GradBuffer routes
each half weight's gradient to its master's view (its fp32 "main grad"), so micro-batches sum in fp32.

A bucket holds one stage's gradients of one dtype, whole layers (a module's own parameters, final at the same
moment of the backward, so never split apart), at most `cap_bytes` of them (a bigger layer gets a bucket of its
own). Layers are packed last to first, the order backward finishes them: the executor starts a bucket's
collective as soon as all of its gradients are final while the backward of earlier layers goes on
(csrc/executor/dp_grad_sync.h).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from . import _C


def _layers_last_first(stage: nn.Module) -> list[list[nn.Parameter]]:
    """Each module's own trainable parameters, modules last to first; a shared parameter once."""
    seen: set[int] = set()
    layers = []
    for module in reversed(list(stage.modules())):
        own = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(map(id, own))
        if own:
            layers.append(own)
    return layers


def _runs_under_cap(layers: list[list[nn.Parameter]], cap_elements: int) -> list[list[nn.Parameter]]:
    """Consecutive layers while they fit the cap; a layer bigger than the cap is a run alone."""
    runs: list[list[nn.Parameter]] = []
    size = cap_elements + 1
    for layer in layers:
        numel = sum(p.numel() for p in layer)
        if size + numel > cap_elements:
            runs.append([])
            size = 0
        runs[-1] += layer
        size += numel
    return runs


def build_grad_buffer(stages: dict[int, nn.Module], stepped: dict[int, torch.Tensor], half_weights: bool,
                      cap_bytes: int, device: torch.device) -> tuple[_C.GradBuffer, dict[int, list[int]]]:
    """The GradBuffer of `stages` and, per stage, its bucket ids.

    stepped: id(model parameter) -> the tensor the optimizer steps (the parameter itself, or its fp32 master);
    that tensor's .grad becomes a view into a bucket. half_weights: route each half weight's gradient to the
    view too (its fp32 main grad)."""
    buckets: list[torch.Tensor] = []
    stage_buckets: dict[int, list[int]] = {}
    routes: list[tuple[nn.Parameter, torch.Tensor]] = []
    for s, stage in stages.items():
        by_dtype: dict[torch.dtype, list[list[nn.Parameter]]] = {}
        for layer in _layers_last_first(stage):
            for dtype in dict.fromkeys(stepped[id(p)].dtype for p in layer):
                by_dtype.setdefault(dtype, []).append([p for p in layer if stepped[id(p)].dtype == dtype])
        stage_buckets[s] = []
        for dtype, layers in by_dtype.items():
            for run in _runs_under_cap(layers, cap_bytes // dtype.itemsize):
                flat = torch.zeros(sum(p.numel() for p in run), dtype=dtype, device=device)
                offset = 0
                for p in run:
                    view = flat[offset : offset + p.numel()].view_as(p)
                    stepped[id(p)].grad = view
                    if half_weights:
                        routes.append((p, view))
                    offset += p.numel()
                stage_buckets[s].append(len(buckets))
                buckets.append(flat)
    grads = _C.GradBuffer(buckets)
    for param, view in routes:
        grads.set_main_grad(param, view)
    return grads, stage_buckets


def attach(stages: dict[int, nn.Module], grads: _C.GradBuffer) -> None:
    """Hand the buffer to every layer that writes gradients through it (hybrid_engine.tp_layers)."""
    for stage in stages.values():
        for module in stage.modules():
            if hasattr(module, "grad_buffer"):
                module.grad_buffer = grads
