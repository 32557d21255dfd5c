"""Host time of one call of the engine's linear layer function on the CPU, at a shape where the arithmetic is
negligible (x [4, 8], W [8, 8]), with and without the engine's GradBuffer, beside torch's F.linear: what a layer
costs the host per micro-batch. In a tree with the operators (parallel/tensor/ops.py) it times `ops.linear`; in an
older tree, the pybind call `_C.linear` it replaced, so the same script compares two checkouts:

    python experiments/bench/op_call_cost.py                        # from the repository root of each tree
"""
from __future__ import annotations

import json
import time

import torch

import hybrid_engine._C as _C

try:
    from hybrid_engine.parallel.tensor import ops
    CALL, NAME = ops.linear, "ops.linear"
except ImportError:  # a tree from before the operators
    CALL, NAME = _C.linear, "_C.linear"


def per_call_us(fn, calls: int = 20000) -> float:
    for _ in range(calls // 10):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    buffer = _C.GradBuffer([torch.zeros(64)])
    rows = {f"{NAME} with a GradBuffer": lambda: CALL(x, w, None, buffer),
            f"{NAME} without": lambda: CALL(x, w, None, None),
            "F.linear": lambda: torch.nn.functional.linear(x, w)}
    print(json.dumps({name: round(min(per_call_us(fn) for _ in range(3)), 2) for name, fn in rows.items()}))


if __name__ == "__main__":
    main()
