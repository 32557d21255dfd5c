"""The zero-bubble schedules with their autograd stages graphed: each micro-batch holds its slot of graphs from its F
to its W (the W reads the stashes its I left over the slot's buffers), so `slots` counts F to W where a stage's
actions have W; the planner times a replayed I as one launch and the W as the eager stage's, and predicts the
graphed zbv of the GPT at pp4 (host-bound: a layer's Python and launches beside its kernels) faster than its eager
zbv; its memory keeps a slot's activations per micro-batch from F to W."""
from __future__ import annotations

import dataclasses

from hybrid_engine.parallel.pipeline.graphs import slots
from hybrid_engine.parallel.pipeline.schedule import compute_schedule
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.memory import peak_bytes
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import stage_costs, step_time
from hybrid_engine.train.cli import parse_config

H200 = CARDS["h200"]
GPT_PP4 = ["--model", "gpt", "--hidden", "2560", "--layers", "12", "--heads", "20", "--seq-len", "1024",
           "--batch-size", "32", "--amp", "bf16", "--optimizer", "adamw", "--clip-grad", "0"]


def gpt_pp4():
    cfg = parse_config(GPT_PP4)
    return shape_of(cfg), Setting.of(cfg, 1, 4, 1)


def in_flight_to(actions, stage: int, ends: tuple[str, ...]) -> int:
    """The most micro-batches of `stage` in flight at once, each from its F to its first action of `ends`."""
    live, most = set(), 0
    for a in actions:
        if a.stage != stage:
            continue
        if a.type.name == "F":
            live.add(a.micro)
            most = max(most, len(live))
        elif a.type.name in ends:
            live.discard(a.micro)
    return most


def test_slots_hold_a_micro_batch_from_its_f_to_its_w():
    for name, pp, v in (("zb1", 2, 1), ("zb1", 4, 1), ("zbv", 2, 2), ("zbv", 4, 2), ("dualpipev", 4, 2)):
        program = compute_schedule(name, pp, 8, v, 0)
        for rank, actions in enumerate(program):
            for stage in {a.stage for a in actions}:
                want = in_flight_to(actions, stage, ("B", "W"))
                assert slots(actions, stage) == want, (name, pp, rank, stage)
    # zb1's last stage at pp2 runs the next F between a micro-batch's I and its W: a slot given back at I would
    # be overwritten before its W read the stashes
    zb1 = compute_schedule("zb1", 2, 8, 1, 0)
    assert slots(zb1[1], 1) == 2 > in_flight_to(zb1[1], 1, ("B", "I")) == 1


def test_a_replayed_i_is_one_launch_and_its_w_stays_eager():
    shape, s = gpt_pp4()
    plan = Plan("zbv", 8, 2)
    on = stage_costs(shape, H200, dataclasses.replace(s, cuda_graphs="on"), plan, replayed=True)[0]
    off = stage_costs(shape, H200, dataclasses.replace(s, cuda_graphs="off"), plan, replayed=False)[0]
    for replayed, eager in zip(on, off):
        assert replayed.W == eager.W  # the eager W's host work and launches
        assert replayed.I < eager.I and replayed.F < eager.F


def test_the_graphed_zbv_of_a_host_bound_gpt_at_pp4_is_predicted_faster_than_its_eager_zbv():
    shape, s = gpt_pp4()
    plan = Plan("zbv", 8, 2)
    on = step_time(shape, H200, dataclasses.replace(s, cuda_graphs="on"), plan)
    off = step_time(shape, H200, dataclasses.replace(s, cuda_graphs="off"), plan)
    assert on.graphs and not off.graphs
    assert on.step_s < off.step_s
    # auto takes the replay where it is predicted faster
    assert step_time(shape, H200, dataclasses.replace(s, cuda_graphs="auto"), plan).graphs
    # merged W is never replayed: every micro-batch would hold its slot to the step's end
    merged = Plan("zbv", 8, 2, merge_wgrad=True)
    assert not step_time(shape, H200, dataclasses.replace(s, cuda_graphs="on"), merged).graphs


def test_replayed_zero_bubble_stages_keep_their_slots_from_f_to_w():
    shape, s = gpt_pp4()
    for plan in (Plan("zb1", 8), Plan("zbv", 8, 2)):
        eager = peak_bytes(shape, s, plan, H200.workspace_bytes)
        replayed = peak_bytes(shape, s, plan, H200.workspace_bytes, replayed=True)
        # each stage's slots live through the run: a rank of two stages (zbv) keeps each one's own peak of
        # micro-batches in flight, not the two's joint one, which the eager rank holds; beside them the slots'
        # static buffers and the step's transfers (planner/graph_pools.py). Measured on this GPT's graphed zbv
        # (its 32000-token vocabulary): up to 2.26 x beside the weights what its eager run allocated (rank 0;
        # 2026-11-28-4xH200-pp4-schedules-zbv-graphed.json)
        for e, r in zip(eager, replayed):
            assert e.static == r.static and e.dynamic < r.dynamic < 2.5 * e.dynamic, plan
