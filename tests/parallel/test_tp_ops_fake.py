"""The tensor-parallel operators' fake kernels (parallel/tensor/ops.py): under FakeTensor (inference mode, where the
dispatcher reaches them directly) every operator gives its output's shape for the group it names, on 2 gloo ranks,
without running a collective."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from dist_utils import run_ranks
from hybrid_engine.parallel.tensor import ops


def _fake_shapes(rank: int, world: int) -> dict[str, tuple]:
    group = dist.new_group(list(range(world)))
    with torch.inference_mode(), FakeTensorMode():
        x, w = torch.empty(2, 8, 6), torch.empty(5, 6)
        shapes = {
            "linear": ops.linear(x, w),
            "column": ops.column_parallel_linear(x, w, None, None, group),
            "column_sp": ops.column_parallel_linear(x, w, None, None, group, True),
            "row": ops.row_parallel_linear(x, w, None, group),
            "row_sp": ops.row_parallel_linear(x, w, None, group, True),
            "copy_to": ops.copy_to_mp_region(x, group),
            "reduce_from": ops.reduce_from_mp_region(x, group),
            "gather_from": ops.gather_from_mp_region(x, group),
            "gather_seq": ops.gather_along_sequence(x, group),
            "reduce_scatter_seq": ops.reduce_scatter_along_sequence(x, group),
            "scatter_seq": ops.scatter_along_sequence(x, group),
        }
    return {name: tuple(t.shape) for name, t in shapes.items()}


def test_fake_kernels_give_every_operator_its_shape():
    want = {"linear": (2, 8, 5), "column": (2, 8, 5), "column_sp": (2, 16, 5), "row": (2, 8, 5),
            "row_sp": (2, 4, 5), "copy_to": (2, 8, 6), "reduce_from": (2, 8, 6), "gather_from": (2, 8, 12),
            "gather_seq": (2, 16, 6), "reduce_scatter_seq": (2, 4, 6), "scatter_seq": (2, 4, 6)}
    for shapes in run_ranks(2, _fake_shapes):
        assert shapes == want
