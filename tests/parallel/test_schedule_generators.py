"""Generators (naive, gpipe, 1f1b, interleaved, zb1; zbv and dualpipev in test_v_schedules.py), the lowering
pass, and request checking."""
from __future__ import annotations

import pytest

from hybrid_engine.parallel.pipeline.schedule import (SCHEDULES, Action, add_communication, compute_schedule,
                                                      make_schedule, schedule_placement, simulate, validate)


def grid(schedule) -> list[str]:
    return [" ".join(str(a) for a in rank) for rank in schedule]


def legal_requests(max_pp: int = 8, max_m: int = 32, max_v: int = 4):
    for pp in range(1, max_pp + 1):
        for m in range(1, max_m + 1):
            for v in range(1, max_v + 1):
                for name in SCHEDULES:
                    if name == "interleaved" and (v < 2 or pp < 2 or m % pp):
                        continue
                    if name in ("zbv", "dualpipev"):
                        if v != 2 or (name == "dualpipev" and m < 2 * pp):
                            continue
                    elif name not in ("interleaved", "gpipe") and v != 1:
                        continue
                    yield name, pp, m, v


def test_1f1b_is_warmup_steady_cooldown():
    assert grid(compute_schedule("1f1b", 4, 8)) == [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7",
    ]


def test_1f1b_with_fewer_micro_batches_than_ranks_warms_up_with_all_of_them():
    assert grid(compute_schedule("1f1b", 4, 2)) == [
        "0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1", "2F0 2F1 2B0 2B1", "3F0 3B0 3F1 3B1",
    ]


def test_gpipe_runs_all_forwards_then_all_backwards():
    assert grid(compute_schedule("gpipe", 2, 3)) == ["0F0 0F1 0F2 0B0 0B1 0B2", "1F0 1F1 1F2 1B0 1B1 1B2"]


def test_gpipe_with_virtual_stages_loops_breadth_first_over_chunks():
    assert grid(compute_schedule("gpipe", 2, 2, 2)) == [
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1", "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1",
    ]


def test_naive_finishes_each_micro_batch_before_the_next():
    assert grid(compute_schedule("naive", 2, 3)) == ["0F0 0B0 0F1 0B1 0F2 0B2", "1F0 1B0 1F1 1B1 1F2 1B2"]


def test_zb1_splits_backward_and_defers_w_by_rank():
    assert grid(compute_schedule("zb1", 3, 4)) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3",
    ]


def test_interleaved_follows_megatrons_chunk_rounds():
    # Rounds of pp micro-batches per chunk; warm-up (v - 1) pp + 2 (pp - r - 1) forwards on rank r.
    assert grid(compute_schedule("interleaved", 2, 4, 2)) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


def test_lowering_sends_after_the_producer_and_posts_receives_one_compute_ahead():
    assert grid(make_schedule("1f1b", 2, 3)) == [
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2",
        "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2",
    ]


def test_lowering_posts_receives_in_the_senders_order():
    # Rank 1 consumes micro-batch 1 first, but rank 0 sends micro-batch 0 first; a FIFO channel needs
    # micro-batch 0's receive posted first, so it is pulled ahead of its consumer.
    compute = [[Action.parse(t) for t in "0F0 0F1 0B0 0B1".split()],
               [Action.parse(t) for t in "1F1 1F0 1B0 1B1".split()]]
    lowered = add_communication(compute)
    assert grid(lowered)[1] == "1RECV_F0 1RECV_F1 1F1 1F0 1B0 1SEND_B0 1B1 1SEND_B1"
    validate(lowered)
    # 0F0 0F1 on [0, 2]; 1F1 1F0 1B0 1B1 on [2, 8]; 0B0 waits for 1B0 (ends at 6), 0B1 for 1B1: [8, 10].
    assert simulate(lowered).makespan == 10.0


def test_every_generated_schedule_is_valid_and_simulates():
    count = 0
    for name, pp, m, v in legal_requests():
        schedule = make_schedule(name, pp, m, v)
        placement = schedule_placement(name)
        validate(schedule, micro_batches=m, num_stages=pp * v, placement=placement)
        result = simulate(schedule, num_stages=pp * v, placement=placement)
        assert result.makespan > 0, (name, pp, m, v)
        count += name not in ("zbv", "dualpipev")
    assert count == 1951


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b", "zb1"])
def test_one_rank_needs_no_communication(name):
    schedule = make_schedule(name, 1, 4)
    assert all(a.is_compute for a in schedule[0])
    result = simulate(schedule)
    assert result.bubble == 0.0


@pytest.mark.parametrize("request_,message", [
    (("1f1b", 0, 4, 1), "pp must be >= 1 (got 0)"),
    (("1f1b", 2, 0, 1), "micro-batches must be >= 1 (got 0)"),
    (("gpipe", 2, 4, 0), "virtual stages must be >= 1 (got 0)"),
    (("pipedream", 2, 4, 1), "unknown schedule 'pipedream'"),
    (("1f1b", 2, 4, 2), "1f1b runs one stage per rank"),
    (("zb1", 2, 4, 2), "zb1 runs one stage per rank"),
    (("naive", 2, 4, 2), "naive runs one stage per rank"),
    (("interleaved", 2, 4, 1), "the interleaved schedule needs --virtual-stages >= 2"),
    (("interleaved", 1, 4, 2), "interleaved needs pp >= 2"),
    (("interleaved", 4, 6, 2), "interleaved needs micro-batches to be a multiple of pp (got micro-batches=6, pp=4)"),
    (("gpipe", 1024, 1 << 20, 4), "schedule too large"),
])
def test_illegal_requests_get_a_clear_error(request_, message):
    with pytest.raises(ValueError) as err:
        make_schedule(*request_)
    assert message in str(err.value)
