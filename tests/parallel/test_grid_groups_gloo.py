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


def _all_reduce_with_a_silent_peer(rank: int, world_size: int, timeout_s: float | None) -> str | None:
    """Rank 1 never joins rank 0's all-reduce over their DP group; rank 0 must get an error, not wait on."""
    from hybrid_engine.parallel.grid import build_groups

    groups = build_groups(_C.ProcessGrid(2, 1, 1), rank, timeout_s=timeout_s)
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["rank0_done"])  # silent until rank 0 gave up
        return None
    try:
        _C._testing.all_reduce_sum(torch.ones(1), groups.dp)
        outcome = "completed without its peer"
    except RuntimeError as exc:
        outcome = str(exc)
    store.set("rank0_done", "1")
    return outcome


def test_grid_groups_give_up_on_a_silent_peer_after_the_given_timeout():
    # without `timeout=`, new_group waits torch's default 30 minutes (here: run_ranks' 60 s) for it
    outcome = run_ranks(2, _all_reduce_with_a_silent_peer, 2.0, timeout=60)[0]
    assert "Timed out" in outcome and "2000ms" in outcome, outcome



def _group_timeouts(rank: int, world_size: int) -> list[float]:
    from hybrid_engine.parallel.grid import build_groups, world_timeout

    groups = build_groups(_C.ProcessGrid(1, 2, 1), rank)
    members = [groups.dp, groups.pp, groups.mp, groups.model_parallel] + [c.group for c in groups.channels.values()]
    timeouts = [g._get_backend(torch.device("cpu")).options._timeout.total_seconds() for g in members]
    return [world_timeout().total_seconds(), *timeouts]


def test_grid_groups_default_to_the_world_groups_timeout():
    # run_ranks' world group waits 45 s; so does every grid group when build_groups is given no timeout
    for timeouts in run_ranks(2, _group_timeouts, timeout=45):
        assert timeouts == [45.0] * len(timeouts), timeouts
