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

from dataclasses import dataclass, field

import torch
import torch.nn as nn

import hybrid_engine._C as _C


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


@dataclass
class BufferLayout:
    """What build_grad_buffer laid out: the C++ buffer, each stage's bucket ids, and each bucket's members as
    (model parameter, element offset) in bucket order (a distributed optimizer lays its parameter buffers out
    the same way)."""

    grads: _C.GradBuffer
    stage_buckets: dict[int, list[int]]
    members: list[list[tuple[nn.Parameter, int]]] = field(default_factory=list)


def _isolate(runs: list[list[nn.Parameter]], alone: set[int]) -> list[list[nn.Parameter]]:
    """The runs with every parameter of `alone` (ids) cut out into a run of its own, in place."""
    out: list[list[nn.Parameter]] = []
    for run in runs:
        rest: list[nn.Parameter] = []
        for p in run:
            if id(p) in alone:
                out += [rest, [p]] if rest else [[p]]
                rest = []
            else:
                rest.append(p)
        if rest:
            out.append(rest)
    return out


def build_grad_buffer(stages: dict[int, nn.Module], stepped: dict[int, torch.Tensor | None], half_weights: bool,
                      cap_bytes: int, device: torch.device, pad_to: int = 1,
                      alone: set[int] = frozenset(), route_all: bool = False) -> BufferLayout:
    """The GradBuffer of `stages`.

    stepped: id(model parameter) -> the tensor whose .grad becomes the parameter's view into its bucket (the
    parameter itself, or its fp32 master), or None where no tensor takes it (a sharded optimizer reads the
    buckets directly); the bucket then has the parameter's dtype, or fp32 with half weights. half_weights: route
    each half weight's gradient to its view (its fp32 main grad). pad_to: every bucket's length is a multiple of
    it (a reduce-scatter over that many DP ranks splits it into equal shards). alone: id() of parameters that
    get a bucket of their own (ZeRO-1's tied copies: equal buckets, so equal DP shards, on both stages).
    route_all: route every parameter's gradient to its view, not only half ones (ZeRO-2/3 reducing per
    micro-batch: every write then goes through the C++ GradBuffer, which restores a released bucket first); the
    buckets are then released from the start, so the whole gradient never exists at once, not even before the
    first step."""
    def grad_dtype(p: nn.Parameter) -> torch.dtype:
        owner = stepped[id(p)]
        return owner.dtype if owner is not None else (torch.float32 if half_weights else p.dtype)

    buckets: list[torch.Tensor] = []
    layout = BufferLayout(grads=None, stage_buckets={})
    routes: list[tuple[nn.Parameter, torch.Tensor]] = []
    for s, stage in stages.items():
        by_dtype: dict[torch.dtype, list[list[nn.Parameter]]] = {}
        for layer in _layers_last_first(stage):
            for dtype in dict.fromkeys(grad_dtype(p) for p in layer):
                by_dtype.setdefault(dtype, []).append([p for p in layer if grad_dtype(p) == dtype])
        layout.stage_buckets[s] = []
        for dtype, layers in by_dtype.items():
            for run in _isolate(_runs_under_cap(layers, cap_bytes // dtype.itemsize), alone):
                numel = sum(p.numel() for p in run)
                flat = torch.zeros(-(-numel // pad_to) * pad_to, dtype=dtype, device=device)
                members, offset = [], 0
                for p in run:
                    view = flat[offset : offset + p.numel()].view_as(p)
                    if stepped[id(p)] is not None:
                        stepped[id(p)].grad = view
                    if half_weights or route_all:
                        routes.append((p, view))
                    members.append((p, offset))
                    offset += p.numel()
                if route_all:  # every write restores it (zeroed) first: no bucket exists until its first write
                    _C.release_storage(flat)
                layout.stage_buckets[s].append(len(buckets))
                layout.members.append(members)
                buckets.append(flat)
    layout.grads = _C.GradBuffer(buckets)
    for param, view in routes:
        layout.grads.set_main_grad(param, view)
    # hybrid_engine's layers write their main grads themselves (and announce them); any other module's parameter
    # (a norm, an embedding) gets its gradient from autograd, and a C++ hook on it (csrc/grad/grad_hooks.h) folds
    # a half one into its fp32 main grad as soon as it lands, micro-batch by micro-batch, as Megatron's main_grad
    # hook does, and announces it final: the DP sync may start the bucket's collective during the stage's last
    # backward instead of after it.
    layout.grads.install_grad_hooks([param for members in layout.members for param, _ in members])
    return layout


def attach(stages: dict[int, nn.Module], grads: _C.GradBuffer, comm_trace=None) -> None:
    """Hand the buffer to every layer that writes gradients through it (hybrid_engine.parallel.tensor.layers), and the
    engine's collective trace (--trace, else None) to every layer that runs MP collectives, the trace in its
    torchbind form, which the layers' torch operators take as it is (parallel/tensor/ops.py)."""
    comm_trace = None if comm_trace is None else comm_trace.script_object
    for stage in stages.values():
        for module in stage.modules():
            if hasattr(module, "grad_buffer"):
                module.grad_buffer = grads
            if hasattr(module, "comm_trace"):
                module.comm_trace = comm_trace
