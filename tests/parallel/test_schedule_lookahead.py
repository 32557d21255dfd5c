"""Lookahead: extra warm-up forwards in 1f1b and zb1 on every rank but the last (csrc/schedule/generators.cpp).

It must keep every program valid and deadlock-free, cost exactly one live micro-batch per extra forward, change
nothing when zero, and shorten the simulated step once sends take time (the gradient's round trip)."""
import pytest

from hybrid_engine.parallel.pipeline.schedule import Costs, compute_schedule, make_schedule, simulate, validate


@pytest.mark.parametrize("name", ["1f1b", "zb1"])
def test_zero_lookahead_is_the_plain_schedule(name):
    for pp in range(1, 6):
        for m in range(1, 10):
            assert make_schedule(name, pp, m, 1, 0) == make_schedule(name, pp, m)


@pytest.mark.parametrize("name", ["1f1b", "zb1"])
def test_valid_and_one_more_live_micro_batch_per_extra_forward(name):
    for pp in range(2, 6):
        for m in range(1, 11):
            for k in range(0, min(3, m) + 1):  # more than m is refused (test_bad_requests_name_the_problem)
                schedule = make_schedule(name, pp, m, 1, k)
                validate(schedule, m)  # raises on any broken program
                result = simulate(schedule, Costs(latency=0.3))
                plain = simulate(make_schedule(name, pp, m), Costs(latency=0.3))
                for r in range(pp - 1):
                    assert result.peak_activations[r] == min(plain.peak_activations[r] + k, m), (pp, m, k, r)
                # the last rank computes the loss itself: same program as without lookahead
                assert schedule[-1] == make_schedule(name, pp, m)[-1]


def test_compute_order_of_rank_zero():
    # pp=2, m=4, lookahead 1: two forwards before the first backward on rank 0, then one of each in turn
    rank0 = [f"{a.type.name}{a.micro}" for a in compute_schedule("1f1b", 2, 4, 1, 1)[0]]
    assert rank0 == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]


@pytest.mark.parametrize("name, gain_per_latency", [("1f1b", 4), ("zb1", 0)])
def test_hides_the_round_trip_once_sends_take_time(name, gain_per_latency):
    # Unit costs (F=1, B=2, I=W=1): without latency nothing changes; with latency plain 1F1B waits on every
    # gradient's round trip and one extra forward of cover removes most of that wait. zb1's deferred W already
    # fill part of the wait, so its gain is smaller, but still there (and all of it once W are merged into
    # one GEMM at the end, which the simulator does not model).
    assert simulate(make_schedule(name, 2, 8, 1, 1)).makespan == simulate(make_schedule(name, 2, 8)).makespan
    for latency in (0.25, 0.5):
        plain = simulate(make_schedule(name, 2, 8), Costs(latency=latency)).makespan
        ahead = simulate(make_schedule(name, 2, 8, 1, 1), Costs(latency=latency)).makespan
        assert ahead < plain - gain_per_latency * latency, (latency, plain, ahead)


def test_bad_requests_name_the_problem():
    with pytest.raises(ValueError, match="lookahead must be >= 0"):
        make_schedule("1f1b", 2, 4, 1, -1)
    with pytest.raises(ValueError, match="--lookahead applies to --schedule 1f1b and zb1 only \\(got gpipe\\)"):
        make_schedule("gpipe", 2, 4, 1, 1)
    with pytest.raises(ValueError, match="--lookahead 5 is more than the 4 micro-batches of a step"):
        make_schedule("1f1b", 2, 4, 1, 5)
