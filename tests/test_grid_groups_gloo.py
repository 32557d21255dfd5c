"""ProcessGrid member lists become working torch.distributed groups that C++ collectives run over.

Eight gloo ranks (dp 2 x pp 2 x mp 2) create every group from the grid in the same order, then sum over their
own dp, pp, mp and model-parallel groups in C++; the sums must be the oracle's member-rank sums.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from dist_utils import run_ranks
from grid_oracle import AXES, Oracle

from hybrid_engine import _C

DP, PP, MP = 2, 2, 2
ORDER = "mp-dp-pp"


def _sum_over_grid_groups(rank: int, world_size: int) -> dict:
    grid = _C.ProcessGrid(DP, PP, MP, ORDER)
    grid.check_world_size(world_size)
    oracle = Oracle(DP, PP, MP, ORDER)

    # Every rank creates every group, in one order: dist.new_group is collective over the whole world.
    kinds = {axis: grid.groups(axis) for axis in AXES}
    kinds["model_parallel"] = grid.model_parallel_groups()
    expected_members = {axis: oracle.groups(axis) for axis in AXES}
    expected_members["model_parallel"] = oracle.model_parallel_groups()
    mine: dict[str, tuple[list[int], dist.ProcessGroup]] = {}
    for kind, groups in kinds.items():
        assert groups == expected_members[kind], kind
        for members in groups:
            group = dist.new_group(members)
            if rank in members:
                mine[kind] = (members, group)

    sums = {}
    for kind, (members, group) in mine.items():
        assert tuple(_C.group_rank_and_size(group)) == (members.index(rank), len(members)), kind
        # Rank-dependent payload, so a sum over the wrong members cannot pass by accident.
        tensor = torch.tensor([float(rank), 1.0, float(rank * rank)])
        result = _C._testing.all_reduce_sum(tensor, group)
        assert result is tensor or torch.equal(result, tensor)
        expected = torch.tensor([float(sum(members)), float(len(members)), float(sum(r * r for r in members))])
        assert torch.equal(tensor, expected), f"rank {rank} {kind} {members}: {tensor.tolist()} != {expected.tolist()}"
        sums[kind] = (members, tensor.tolist())
    return sums


def test_cpp_all_reduce_over_each_grid_group_sums_its_members():
    results = run_ranks(DP * PP * MP, _sum_over_grid_groups, timeout=90)
    grid = _C.ProcessGrid(DP, PP, MP, ORDER)
    for rank, sums in enumerate(results):
        assert set(sums) == {"dp", "pp", "mp", "model_parallel"}
        for axis in AXES:
            assert sums[axis][0] == grid.group_of(rank, axis)
        assert sums["model_parallel"][0] == grid.model_parallel_group_of(rank)
