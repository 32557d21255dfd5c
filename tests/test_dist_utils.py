"""run_ranks, the multi-rank test launcher: results come back in rank order; a failing, dying or hanging
rank fails the test with its story instead of hanging it."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks


def _sum_of_ranks(rank: int, world_size: int, offset: int) -> float:
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return t.item()


def _rank_1_raises(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom on rank 1")


def _rank_0_dies(rank: int, world_size: int) -> None:
    if rank == 0:
        os._exit(3)
    time.sleep(30)


def _rank_0_dies_then_rank_1_fails(rank: int, world_size: int) -> None:
    if rank == 0:
        os._exit(3)
    time.sleep(0.5)  # rank 0 is gone; this rank's error reaches the parent within the dead rank's grace
    raise RuntimeError("connection closed by peer")


def _rank_1_skips_the_collective(rank: int, world_size: int) -> None:
    if rank != 1:
        dist.all_reduce(torch.zeros(1))
    time.sleep(30)


def test_results_come_back_in_rank_order():
    assert run_ranks(3, _sum_of_ranks, 10) == [33.0, 33.0, 33.0]


def test_a_raising_rank_fails_the_test_with_its_traceback():
    with pytest.raises(pytest.fail.Exception, match="(?s)rank 1 of 2 failed.*ValueError: boom on rank 1"):
        run_ranks(2, _rank_1_raises)


def test_a_dead_rank_fails_the_test():
    # the message is the claim: the death is reported as such, not as the 30 s timeout
    with pytest.raises(pytest.fail.Exception, match="rank 0 of 2 died with exit code 3"):
        run_ranks(2, _rank_0_dies, timeout=30)


def test_a_rank_failing_because_a_peer_died_reports_the_death():
    with pytest.raises(pytest.fail.Exception, match="rank 0 of 2 died with exit code 3"):
        run_ranks(2, _rank_0_dies_then_rank_1_fails, timeout=30)


def test_a_hang_fails_at_the_timeout():
    # whichever comes first: run_ranks' deadline, or the waiting rank's collective timing out after the same 3 s
    # (on a loaded machine the ranks start late enough for either)
    with pytest.raises(pytest.fail.Exception, match=r"still running after 3 s|Timed out waiting 3000ms"):
        run_ranks(2, _rank_1_skips_the_collective, timeout=3)
