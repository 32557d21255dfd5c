"""The V-shaped schedules, zbv and dualpipev (csrc/schedule/v_schedules.cpp): their programs, counts, memory bound,
bubble against 1f1b and zb1, and their rules as one line each."""
from __future__ import annotations

import pytest

import hybrid_engine._C as _C
from hybrid_engine.config.engine import ConfigError, ScheduleConfig
from hybrid_engine.parallel.pipeline.schedule import (Costs, compute_schedule, make_schedule, rank_stages,
                                                      schedule_placement, simulate, validate)
from hybrid_engine.schedule import main

V_SCHEDULES = ("zbv", "dualpipev")


def grid(schedule) -> list[str]:
    return [" ".join(str(a) for a in rank) for rank in schedule]


def test_zbv_pp2_program():
    # Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; every backward split into I and W.
    assert grid(compute_schedule("zbv", 2, 4, 2)) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
    ]


def test_dualpipev_pp2_program_pairs_a_forward_with_another_micro_batchs_backward():
    # "0F3 3B1", "3F2 0B0", ...: the pairs DualPipe overlaps, forward first; the last backwards split, W's last.
    assert grid(compute_schedule("dualpipev", 2, 4, 2)) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3",
    ]


@pytest.mark.parametrize("name", V_SCHEDULES)
@pytest.mark.parametrize("pp,m", [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13)])
def test_counts_validity_and_memory_bound(name, pp, m):
    schedule = make_schedule(name, pp, m, 2)
    assert schedule_placement(name) == "v"
    validate(schedule, micro_batches=m, num_stages=2 * pp, placement="v")
    result = simulate(schedule, num_stages=2 * pp, placement="v")
    for r, actions in enumerate(schedule):
        assert {a.stage for a in actions} == set(rank_stages(r, pp, 2 * pp, "v"))
        for stage in rank_stages(r, pp, 2 * pp, "v"):
            kinds = [a.type.name for a in actions if a.stage == stage and a.is_compute]
            f, b, i, w = (kinds.count(k) for k in "FBIW")
            assert f == m and b + i == m and w == i, (r, stage, kinds)
            if name == "zbv":
                assert b == 0
    # zbv holds 2 pp chunk activations (1f1b's pp stages' worth), dualpipev one chunk more.
    bound = {"zbv": min(2 * m, 2 * pp), "dualpipev": 2 * pp + 1}[name]
    assert max(result.peak_activations) == bound == _C.schedule.activation_bound(name, pp, m, 2)


@pytest.mark.parametrize("name", ["zbv"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_zbv_takes_fewer_micro_batches_than_its_full_pattern(name, m):
    schedule = make_schedule(name, 4, m, 2)
    validate(schedule, micro_batches=m, num_stages=8, placement="v")
    assert simulate(schedule, num_stages=8, placement="v").makespan > 0


@pytest.mark.parametrize("pp,m", [(2, 8), (4, 8), (4, 16)])
def test_bubble_below_1f1b_and_zb1_at_equal_stage_times(pp, m):
    """The same model on the same ranks: a V chunk is half a one-chunk stage, so it costs half (F = I = W = 1/2)."""
    one_chunk = {name: simulate(make_schedule(name, pp, m)).bubble for name in ("1f1b", "zb1")}
    half = Costs(F=0.5, B=1.0, I=0.5, W=0.5)
    for name in V_SCHEDULES:
        v = simulate(make_schedule(name, pp, m, 2), half, placement="v")
        assert v.bubble < one_chunk["zb1"] < one_chunk["1f1b"], (name, v.bubble, one_chunk)
        zb1_makespan = simulate(make_schedule("zb1", pp, m)).makespan
        assert v.makespan < zb1_makespan


def test_pp4_m8_bubbles_printed_by_the_cli(capsys):
    """The numbers the schedules page quotes (docs/schedules.md)."""
    assert main(["--schedule", "zbv", "--pp", "4", "--micro-batches", "8"]) == 0
    out = capsys.readouterr().out
    assert "virtual stages=2, v placement" in out  # the schedule's own chunk count, unasked
    assert "makespan 25.5, bubble 0.059 (1/17)" in out
    assert "rank 3 | 3F0 4F0 3F1 4F1" in out
    assert main(["--schedule", "dualpipev", "--pp", "4", "--micro-batches", "8"]) == 0
    assert "makespan 25.5, bubble 0.059 (1/17)" in capsys.readouterr().out
    for name in V_SCHEDULES:
        assert main(["--schedule", name, "--pp", "4", "--micro-batches", "16"]) == 0
        assert "makespan 49.5, bubble 0.030 (1/33)" in capsys.readouterr().out
        assert main(["--schedule", name, "--pp", "4", "--micro-batches", "8", "--latency", "0.1"]) == 0
        assert "bubble 0.104 (7/67)" in capsys.readouterr().out  # zb1: 7/47 (the turn costs no message)
    assert main(["--schedule", "zb1", "--pp", "4", "--micro-batches", "8", "--latency", "0.1"]) == 0
    assert "bubble 0.149 (7/47)" in capsys.readouterr().out


def test_dualpipev_pairs_on_rank_0():
    """docs/schedules.md: at pp 4, m 16, 21 of rank 0's 32 forwards sit in a (forward, other chunk's backward) pair."""
    actions = compute_schedule("dualpipev", 4, 16, 2)[0]
    pairs = sum(a.type.name == "F" and b.type.name == "B" and a.stage != b.stage for a, b in zip(actions, actions[1:]))
    assert (pairs, sum(a.type.name == "F" for a in actions)) == (21, 32)


@pytest.mark.parametrize("request_,message", [
    (("zbv", 4, 8, 1), "zbv runs two stages per rank in a V (--virtual-stages must be 2, got 1)"),
    (("dualpipev", 2, 8, 4), "dualpipev runs two stages per rank in a V (--virtual-stages must be 2, got 4)"),
    (("dualpipev", 4, 7, 2), "dualpipev needs at least 2 x pp micro-batches (got micro-batches=7, pp=4)"),
    (("zbv", 4, 8, 2, 1), "--lookahead applies to --schedule 1f1b and zb1 only (got zbv)"),
])
def test_rules_are_one_line(request_, message):
    with pytest.raises(ValueError) as err:
        make_schedule(*request_)
    assert str(err.value) == message
    name, pp, m, v, *lookahead = request_
    with pytest.raises(ConfigError) as err:
        ScheduleConfig(name, m, v, lookahead[0] if lookahead else 0).validate(pp)
    assert str(err.value) == message


def test_merged_weight_gradients_need_every_backward_split():
    ScheduleConfig("zbv", 8, 2, merge_weight_grads=True).validate(4)
    with pytest.raises(ConfigError, match="merging weight gradients applies to .* \\(got dualpipev\\)"):
        ScheduleConfig("dualpipev", 8, 2, merge_weight_grads=True).validate(4)


def test_a_micro_batch_count_left_to_the_planner_is_not_refused():
    """--schedule dualpipev alone: the planner picks the micro-batches (at least 2 pp), the check does not guess pp."""
    from hybrid_engine.models import registry
    from hybrid_engine.train.cli import parse_config

    parse_config(["--pp", "2", "--schedule", "dualpipev", "--depth", "8", "--batch-size", "16"]).validate(
        2, "cpu", registry.check_model)
    with pytest.raises(ConfigError, match="dualpipev needs at least 2 x pp micro-batches"):
        parse_config(["--pp", "2", "--schedule", "dualpipev", "--micro-batches", "2", "--depth", "8"]).validate(
            2, "cpu", registry.check_model)


def test_cli_refuses_in_one_line_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--schedule", "dualpipev", "--pp", "4", "--micro-batches", "4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m hybrid_engine.schedule: error: dualpipev needs at least 2 x pp micro-batches "
                   "(got micro-batches=4, pp=4)"]
