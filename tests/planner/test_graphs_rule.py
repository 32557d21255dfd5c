"""One rule for whether stages are graphed: the planner's `graphed` (planner/step_time.py) and the run's choice
(parallel/pipeline/graphs.py's resolve) agree on every combination of the facts the rule reads, so a plan is timed
replayed exactly where the run it names would replay."""
from __future__ import annotations

import dataclasses
import itertools

from hybrid_engine.config.engine import ConfigError, DataParallelConfig, ScheduleConfig, StageConfig
from hybrid_engine.models.mlp.workload import mlp_shape
from hybrid_engine.parallel.pipeline.graphs import resolve
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import graphed

MLP = mlp_shape(64, 8)
# (name, virtual stages, merged W): merging applies to the schedules that split every backward
SCHEDULES = (("1f1b", 1, False), ("interleaved", 2, False), ("zb1", 1, False), ("zbv", 2, False), ("zb1", 1, True),
             ("zbv", 2, True), ("dualpipev", 2, False))


def engine_graphs(mode: str, gpu: bool, native: bool, schedule: str, v: int, recompute: str, zero: int, cp: int,
                  builtin_loss: bool, trace: bool, dp: int, merge: bool = False) -> bool:
    """Whether the run replays its stages: its choice, or False where `on` is refused."""
    pp = 2
    try:
        choice = resolve(mode, "cuda" if gpu else "cpu", [native] * (pp * v), ScheduleConfig(schedule, 4, v, 0, merge),
                         pp,
                         StageConfig(recompute=recompute), DataParallelConfig(zero=zero), builtin_loss, trace, cp)
    except ConfigError:
        return False
    return choice.on


def planner_graphs(mode: str, gpu: bool, native: bool, schedule: str, v: int, recompute: str, zero: int, cp: int,
                   builtin_loss: bool, trace: bool, dp: int, merge: bool = False) -> bool:
    shape = dataclasses.replace(MLP, native=native, builtin_loss=builtin_loss)
    s = Setting(dp, 2, 1, 64, zero=zero, full_recompute=recompute == "full", cp=cp, cuda_graphs=mode,
                selective_recompute=recompute == "selective", trace=trace)
    return graphed(shape, CARDS["h100" if gpu else "cpu"], s, Plan(schedule, 4, v, 0, merge))


def test_the_planner_and_the_run_agree_on_every_combination_of_the_rules_facts():
    facts = itertools.product(("auto", "on", "off"), (True, False), (True, False), SCHEDULES,
                              ("none", "full", "selective"), (0, 1, 2, 3), (1, 2), (True, False), (True, False), (1, 2))
    outcomes, disagreements = [], []
    for mode, gpu, native, (schedule, v, merge), recompute, zero, cp, builtin_loss, trace, dp in facts:
        args = (mode, gpu, native, schedule, v, recompute, zero, cp, builtin_loss, trace, dp, merge)
        run = engine_graphs(*args)
        outcomes.append(run)
        if planner_graphs(*args) != run:
            disagreements.append(args)
    assert len(outcomes) == 3 * 2 * 2 * 7 * 3 * 4 * 2 * 2 * 2 * 2
    assert not disagreements, disagreements[:5]
    # neither side is constant: both replay and both stay eager somewhere
    assert 0 < sum(outcomes) < len(outcomes)


def test_each_fact_alone_keeps_the_planner_eager_as_it_keeps_the_run():
    """From a plan both graph, each fact turned the other way stops the graphs on both sides."""
    base = dict(mode="on", gpu=True, native=True, schedule="1f1b", v=1, recompute="none", zero=1, cp=1,
                builtin_loss=True, trace=False, dp=2)
    assert engine_graphs(**base) and planner_graphs(**base)
    for change in ({"gpu": False}, {"recompute": "full"}, {"recompute": "selective", "native": False},
                   {"schedule": "zb1"}, {"schedule": "zbv", "v": 2}, {"schedule": "dualpipev", "v": 2}, {"zero": 2},
                   {"cp": 2}, {"builtin_loss": False}, {"trace": True}, {"mode": "off"},
                   {"native": False, "schedule": "zb1", "merge": True},
                   {"native": False, "schedule": "zbv", "v": 2, "merge": True}):
        args = {**base, **change}
        assert not engine_graphs(**args) and not planner_graphs(**args), change
    # a native stage's selective recompute (the decoders' option), a decoder's own loss, auto for autograd stages
    # across GPUs, and autograd stages under the zero-bubble schedules (their I replayed, W eager) leave the graphs
    # on
    for change in ({"recompute": "selective"}, {"native": False, "builtin_loss": False},
                   {"mode": "auto", "native": False}, {"native": False, "schedule": "zb1"},
                   {"native": False, "schedule": "zbv", "v": 2}, {"native": False, "schedule": "dualpipev", "v": 2}):
        assert engine_graphs(**{**base, **change}) and planner_graphs(**{**base, **change}), change


def test_a_traced_run_is_timed_eager():
    """--trace keeps the run's stages eager, and the planner's prediction of it with them."""
    from hybrid_engine.planner.step_time import step_time

    s = Setting(1, 4, 1, 64, cuda_graphs="on")
    traced = dataclasses.replace(s, trace=True)
    plan = Plan("1f1b", 8)
    h100 = CARDS["h100"]
    assert step_time(MLP, h100, s, plan).graphs and not step_time(MLP, h100, traced, plan).graphs
    assert step_time(MLP, h100, traced, plan).step_s == step_time(MLP, h100, dataclasses.replace(s, cuda_graphs="off"),
                                                                   plan).step_s
    from hybrid_engine.train.cli import parse_config
    assert Setting.of(parse_config(["--trace", "/tmp/trace"]), 1, 4, 1).trace
    assert not Setting.of(parse_config([]), 1, 4, 1).trace


def test_a_calibrated_cpu_card_is_still_no_gpu():
    """The card's own fact, not its name, says whether it has CUDA graphs."""
    cpu = dataclasses.replace(CARDS["cpu"], name="CPU (calibrated)")
    assert not graphed(MLP, cpu, Setting(1, 2, 1, 64, cuda_graphs="on"), Plan("1f1b", 4))
    assert graphed(MLP, CARDS["h200"], Setting(1, 2, 1, 64, cuda_graphs="on"), Plan("1f1b", 4))
