"""The communication check before the first step: every group of a rank answers one small all-reduce, timed; a group
whose peer does not answer is named by axis, ranks and hosts within the groups' timeout instead of hanging."""
import torch
import torch.distributed as dist
from dist_utils import run_ranks

from hybrid_engine import _C
from hybrid_engine.parallel.nodes import NodeMap
from hybrid_engine.runtime.comm_check import CommCheckError, check_groups, summary

NODES = NodeMap(("a", "b"))


def _check_then_a_silent_peer(rank: int, world_size: int) -> tuple[dict, str | None]:
    from hybrid_engine.parallel.grid import build_groups

    groups = build_groups(_C.ProcessGrid(1, 2, 1), rank, timeout_s=2.0)
    timings = check_groups(groups.named_groups(), NODES.describe_ranks, torch.device("cpu"), 2.0)
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # silent from here on: never joins rank 0's second check
        store.wait(["rank0_done"])
        return timings, None
    try:
        check_groups(groups.named_groups(), NODES.describe_ranks, torch.device("cpu"), 2.0)
        outcome = "completed without its peer"
    except CommCheckError as exc:
        outcome = str(exc)
    store.set("rank0_done", "1")
    return timings, outcome


def test_every_group_answers_and_a_silent_one_is_named():
    (timings0, outcome), (timings1, _) = run_ranks(2, _check_then_a_silent_peer, timeout=60)
    # pp 2: the pipeline group, the replica's model-parallel group and four channels; mp and dp have one rank
    assert sorted(timings0) == sorted(timings1) == ["model-parallel", "pp", "pp act channel 0->1",
                                                    "pp act channel 1->0", "pp grad channel 0->1",
                                                    "pp grad channel 1->0"]
    assert all(seconds >= 0 and sorted(ranks) == [0, 1] for seconds, ranks in timings0.values())
    assert outcome == ("communication check: the pp group of ranks 0, 1 (hosts a, b) did not answer within "
                       "--comm-timeout 2 s; no step was run")
    line = summary([timings0, timings1], NODES.describe_ranks)
    assert line.startswith("communication check (first collective of each group, set-up included): pp 1 group, "
                           "slowest ") and "pp channels 4 groups, slowest" in line and "\n" not in line
