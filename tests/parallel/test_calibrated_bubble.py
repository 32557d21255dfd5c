"""Calibrated simulation: the schedule simulated with each stage's own action durations (simulate's
stage_costs), and the traced bubble over it (hybrid_engine/metrics/trace.py): what the executor adds beyond the idle
time that unequal stages imply."""
from __future__ import annotations

import json

import pytest

from hybrid_engine.parallel.pipeline.schedule import Costs, make_schedule, simulate, timeline_rows
from hybrid_engine.metrics.trace import calibrated_bubble, measured_bubble, rows_of_chrome_trace, stage_costs


def test_unequal_stages_by_hand():
    # 1F1B, pp=2, m=2; stage 0: F=1, B=2; stage 1: F=2, B=3.
    # rank 1: F [1,3], B [3,6], F [6,8], B [8,11]; rank 0: F [0,1], F [1,2], B [6,8] (waits for the gradient
    # sent at 6), B [11,13]. Makespan 13, busy 6 + 10: bubble (26 - 16) / 26.
    result = simulate(make_schedule("1f1b", 2, 2), stage_costs=[Costs(1, 2), Costs(2, 3)])
    assert result.makespan == 13
    assert result.bubble == pytest.approx(10 / 26)


def test_equal_stage_costs_are_the_global_costs():
    program = make_schedule("zb1", 4, 8)
    costs = Costs(1.5, 3, 1.25, 1.75, latency=0.1)
    same = simulate(program, costs, stage_costs=[Costs(1.5, 3, 1.25, 1.75)] * 4)
    assert same.bubble == simulate(program, costs).bubble and same.makespan == simulate(program, costs).makespan


@pytest.mark.parametrize("stage_costs_arg,message", [([Costs()], "stage_costs has 1 entries for 2 stages"),
                                                     ([Costs(), Costs(-1.0)], "stage costs must be >= 0")])
def test_bad_stage_costs_are_refused(stage_costs_arg, message):
    with pytest.raises(ValueError, match=message):
        simulate(make_schedule("1f1b", 2, 4), stage_costs=stage_costs_arg)


def spans(result) -> list[list[tuple]]:
    """A simulated timeline as trace spans (type, stage, micro, start, end)."""
    return [[(kind, stage, micro, start, end) for start, end, kind, stage, micro in row]
            for row in timeline_rows(result)]


def test_an_executor_that_adds_nothing_measures_the_calibrated_bubble():
    stage_durations = [Costs(1.0, 2.1), Costs(1.2, 2.3)]
    result = simulate(make_schedule("1f1b", 2, 8), stage_costs=stage_durations)
    rows = spans(result)
    measured = [(c.F, c.B) for c in stage_costs(rows, 2)]
    assert measured == [pytest.approx((1.0, 2.1)), pytest.approx((1.2, 2.3))]
    assert calibrated_bubble(rows, "1f1b", 8, 1) == pytest.approx(measured_bubble(rows))
    # the unit-cost simulation of equal stages does not: it leaves out the slower last stage's idle cost
    assert measured_bubble(rows) > simulate(make_schedule("1f1b", 2, 8)).bubble


def test_a_written_trace_reads_back(tmp_path):
    rows = spans(simulate(make_schedule("1f1b", 2, 4)))
    events = [{"name": f"{s}{k}{m}", "cat": k, "ph": "X", "ts": a, "dur": b - a, "pid": 0, "tid": rank,
               "args": {"stage": s, "micro": m}} for rank, row in enumerate(rows) for k, s, m, a, b in row]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert rows_of_chrome_trace(str(path)) == rows
