"""simulate(): bubble and memory numbers of every schedule, timing details, and deadlock detection.

"Unit costs" here are the defaults F=1, B=2 (= I + W), I=1, W=1, latency 0, per action; the GPipe/1F1B formula
also holds with F=B=1, I=W=0.5, which is checked too.
"""
from __future__ import annotations

import pytest

from hybrid_engine.parallel.pipeline.schedule import Action, Costs, ScheduleDeadlockError, make_schedule, simulate

UNIT = Costs()
EQUAL_FB = Costs(F=1, B=1, I=0.5, W=0.5)
SIZES = [(p, m) for p in range(2, 9) for m in range(p, 4 * p + 1)]


def bubble(name: str, p: int, m: int, v: int = 1, costs: Costs = UNIT) -> float:
    return simulate(make_schedule(name, p, m, v), costs).bubble


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_matches_formula(name):
    for p, m in SIZES:
        for costs in (UNIT, EQUAL_FB):
            assert bubble(name, p, m, costs=costs) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12), (p, m)


def test_interleaved_bubble_shrinks_by_the_chunk_count():
    # (p - 1) / (v m + p - 1): each chunk's F and B cost 1 and 2, so a rank's work is v times a 1F1B rank's.
    for p, m in SIZES:
        if m % p:
            continue
        for v in (2, 3, 4):
            assert bubble("interleaved", p, m, v) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12), (p, m, v)


def test_zb1_bubble_is_a_third_of_1f1b_idle_time():
    # With F = I = W the ZB-H1 idle per rank is (p - 1) F against 1F1B's (p - 1)(F + B) = 3 (p - 1) F.
    for p, m in SIZES:
        result = simulate(make_schedule("zb1", p, m), UNIT)
        assert result.bubble == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12), (p, m)
        assert result.idle == pytest.approx([p - 1] * p)


def test_schedules_rank_naive_above_gpipe_1f1b_above_interleaved_and_zb1():
    for p, m in SIZES:
        one_f_one_b = bubble("1f1b", p, m)
        assert bubble("zb1", p, m) < one_f_one_b
        if m % p == 0:
            assert bubble("interleaved", p, m, 2) < one_f_one_b
        others = [bubble(n, p, m) for n in ("gpipe", "1f1b", "zb1")]
        assert bubble("naive", p, m) > max(others)
        assert bubble("naive", p, m) == pytest.approx(1 - 1 / p, abs=1e-12)


def test_peak_activations_are_m_for_gpipe_and_at_most_p_for_1f1b_and_zb1():
    for p, m in SIZES + [(4, 2), (8, 3)]:
        assert simulate(make_schedule("gpipe", p, m)).peak_activations == [m] * p
        assert simulate(make_schedule("1f1b", p, m)).peak_activations == [min(p - r, m) for r in range(p)]
        assert max(simulate(make_schedule("zb1", p, m)).peak_activations) <= p
        assert simulate(make_schedule("naive", p, m)).peak_activations == [1] * p


def test_zb1_holds_p_activations_on_every_rank_until_w():
    # Rank r warms up with p - r - 1 forwards and defers r W's: p live, as many as 1F1B's rank 0.
    assert simulate(make_schedule("zb1", 4, 8)).peak_activations == [4, 4, 4, 4]


def test_the_cli_example_numbers():
    result = simulate(make_schedule("1f1b", 4, 8))
    assert (result.makespan, result.bubble) == (33.0, pytest.approx(3 / 11))
    assert result.busy == [24.0] * 4 and result.idle == [9.0] * 4


def test_latency_delays_every_hop():
    # p = 2, m = 1: 0F0 [0,1] -> +0.5 -> 1F0 [1.5,2.5] 1B0 [2.5,4.5] -> +0.5 -> 0B0 [5,7].
    result = simulate(make_schedule("1f1b", 2, 1), Costs(latency=0.5))
    assert result.makespan == 7.0
    times = {str(t.action): (t.start, t.end) for rank in result.timeline for t in rank}
    assert times["1F0"] == (1.5, 2.5) and times["0B0"] == (5.0, 7.0)
    assert times["1RECV_F0"] == (0.0, 1.5)  # posted at once, data arrived at 1.5
    assert times["0SEND_F0"] == (1.0, 1.0)


def test_timeline_lists_every_action_in_program_order():
    schedule = make_schedule("interleaved", 2, 4, 2)
    result = simulate(schedule)
    assert [[t.action for t in rank] for rank in result.timeline] == schedule
    for rank in result.timeline:
        computes = [t for t in rank if t.action.is_compute]
        assert all(a.end <= b.start + 1e-12 for a, b in zip(computes, computes[1:]))


def test_send_moved_behind_its_reply_deadlocks_naming_the_stuck_actions():
    # Rank 2 holds back micro-batch 7's activation until after its own backward of micro-batch 7, which needs
    # rank 3's gradient, which needs that activation.
    schedule = make_schedule("1f1b", 4, 8)
    rank2 = schedule[2]
    send = rank2.pop(rank2.index(Action.parse("2SEND_F7")))
    rank2.insert(rank2.index(Action.parse("2B7")) + 1, send)
    with pytest.raises(ScheduleDeadlockError) as err:
        simulate(schedule)
    text = str(err.value)
    assert isinstance(err.value, RuntimeError)
    assert "rank 2 is stuck at 2B7" in text and "waiting for 3SEND_B7 from rank 3" in text
    assert "rank 3 is stuck at 3F7" in text and "waiting for 2SEND_F7 from rank 2" in text
    assert "rank 0 is stuck at 0B7" in text and "rank 1 is stuck at 1B7" in text


def test_swapped_receive_pair_is_caught_naming_both_ends():
    # Rank 1 posts micro-batch 3's receive before micro-batch 2's: the 3rd message on the channel (0SEND_F2)
    # would land in micro-batch 3's buffer.
    schedule = make_schedule("1f1b", 4, 8)
    rank1 = schedule[1]
    late = rank1.pop(rank1.index(Action.parse("1RECV_F3")))
    rank1.insert(rank1.index(Action.parse("1RECV_F2")), late)
    with pytest.raises(ValueError) as err:
        simulate(schedule)
    assert "message #2 is sent by rank 0" in str(err.value) and "(0SEND_F2)" in str(err.value)
    assert "(1RECV_F3)" in str(err.value)


def test_compute_only_schedule_must_be_lowered_before_simulating():
    from hybrid_engine.parallel.pipeline.schedule import compute_schedule

    with pytest.raises(ValueError, match="add_communication"):
        simulate(compute_schedule("1f1b", 2, 2))


def test_negative_costs_are_rejected():
    with pytest.raises(ValueError, match="costs and latency must be >= 0"):
        simulate(make_schedule("1f1b", 2, 2), Costs(F=-1))
