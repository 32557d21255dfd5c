"""How many aten operators a layer dispatches for one micro-batch, forward and backward: counted by running it once
on the CPU at a small size under a TorchDispatchMode, which sees every operator that reaches the dispatcher below
autograd (the C++ tensor-parallel functions' GEMMs and views included). The count depends on the layer's code, not
on its sizes, so a block of a few features per head counts what the real one dispatches. The tensor-parallel
collectives are not aten operators here (a layer counted without a group runs none): the planner times them on
their own. What is counted is what this torch dispatches on the CPU: on CUDA a few may run fused (rms_norm as one
operator), so the host's cost an operator that the planner's floor multiplies this by (planner/step_time.py
host_floor, Card.op_host_s) is fitted per operator counted here."""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class _Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def dispatched_ops(layer: nn.Module, x: torch.Tensor) -> tuple[int, int, int]:
    """(forward, backward, backward without the weight gradients) aten operators `layer` dispatches on input `x`
    (which it must take alone): one call first, uncounted (buffers and caches a first call fills), then a counted
    forward and its backward; then a backward with the parameters frozen, which computes the input's gradient
    alone (what a backward dispatches when its weight gradients are deferred to a W action)."""
    x = x.detach().requires_grad_(True)
    layer(x).float().sum().backward()
    counts = []
    for weights in (True, False):
        for p in layer.parameters():
            p.requires_grad_(weights)
        with _Counting() as forward:
            y = layer(x)
        grad = torch.ones_like(y)
        with _Counting() as backward:
            y.backward(grad)
        counts.append((sum(forward.ops.values()), sum(backward.ops.values())))
    for p in layer.parameters():
        p.requires_grad_(True)
    return counts[0][0], counts[0][1], counts[1][1]
