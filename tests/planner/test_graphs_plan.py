"""The planner and CUDA graphs: a plan whose stages replay as graphs pays one launch a stage's F and B instead of
the host's fixed cost for every layer, and exposes the DP gradient collectives its eager backward hid
(planner/step_time.py), so a host-bound MLP grid's predicted step drops with --cuda-graphs on, auto takes whichever
of replayed and eager is faster, and plans the graphs do not cover predict what they did. A transformer's replayed
stages drop their Python and launches a layer and keep one slot of activations per micro-batch in flight; auto
leaves them eager where that does not fit, and refuses or leaves eager what the graphs cannot hold."""
from __future__ import annotations

import dataclasses

import pytest

from hybrid_engine.models.mlp.workload import mlp_shape
from hybrid_engine.planner import CARDS
from hybrid_engine.planner.candidates import Plan
from hybrid_engine.planner.setting import Setting
from hybrid_engine.planner.step_time import step_time
from hybrid_engine.train.cli import parse_config

C = mlp_shape(8192, 8)  # config C: 64 rows a step, host-bound at 4 GPUs
H100 = CARDS["h100"]


def step_ms(shape, card, setting: Setting, plan: Plan) -> float:
    return 1e3 * step_time(shape, card, setting, plan).step_s


@pytest.mark.parametrize("grid,plan", [((1, 4, 1), Plan("1f1b", 8)), ((1, 1, 4), Plan("1f1b", 1)),
                                       ((1, 2, 2), Plan("interleaved", 4, 2)), ((1, 1, 1), Plan("gpipe", 4))])
def test_graphs_drop_the_per_layer_host_cost_of_a_host_bound_mlp(grid, plan):
    eager = Setting(*grid, 64)
    off, on = step_ms(C, H100, eager, plan), step_ms(C, H100, dataclasses.replace(eager, cuda_graphs="on"), plan)
    # at least the per-layer overhead of one micro-batch's F and B on the busiest stage, less the launch it keeps
    layers = 8 // (grid[1] * plan.virtual_stages)
    assert off - on >= 2 * (layers - 1) * H100.action_overhead_s * 1e3 * 0.99, (off, on)
    assert on < off


@pytest.mark.parametrize("what,setting,plan,card", [
    ("zero-bubble W actions", Setting(1, 4, 1, 64, cuda_graphs="on"), Plan("zb1", 8, merge_wgrad=True), H100),
    ("recompute", Setting(1, 4, 1, 64, full_recompute=True, cuda_graphs="on"), Plan("1f1b", 8), H100),
    ("ZeRO-2", Setting(4, 1, 1, 64, zero=2, cuda_graphs="on"), Plan("1f1b", 1), H100),
    ("the CPU", Setting(1, 4, 1, 64, cuda_graphs="on"), Plan("1f1b", 8), CARDS["cpu"]),
])
def test_plans_the_graphs_do_not_cover_predict_as_before(what, setting, plan, card):
    eager = dataclasses.replace(setting, cuda_graphs="off")
    assert step_ms(C, card, setting, plan) == step_ms(C, card, eager, plan), what


def test_the_run_setting_reads_the_flag():
    assert Setting.of(parse_config([]), 1, 4, 1).cuda_graphs == "auto"
    assert Setting.of(parse_config(["--cuda-graphs", "on"]), 1, 4, 1).cuda_graphs == "on"
    assert Setting.of(parse_config(["--cuda-graphs", "off"]), 1, 4, 1).cuda_graphs == "off"


def test_a_replayed_backward_hides_none_of_the_dp_collectives():
    """The graphed backward announces its gradients after its replay: a dp grid's gradient collectives are all
    exposed, where the eager backward hid all but the last bucket's under its later layers."""
    L = mlp_shape(8192, 16)
    eager = Setting(4, 1, 1, 1024, zero=1)
    off = step_time(L, H100, eager, Plan("1f1b", 1))
    on = step_time(L, H100, dataclasses.replace(eager, cuda_graphs="on"), Plan("1f1b", 1))
    params = sum(layer.params for layer in L.layers)
    whole = H100.collective_s(params * 4, 4, 1.0)  # fp32 gradients reduce-scattered over 4 ranks (ZeRO-1)
    gather = H100.collective_s(params * 2, 4, 1.0)  # the updated fp16 weights gathered after the step, either way
    assert on.dp_exposed_s == pytest.approx(whole + gather) and off.dp_exposed_s < whole + gather
    assert on.graphs and not off.graphs
    # auto: here the eager step, whose backward hides the collectives, is predicted faster
    auto = step_time(L, H100, dataclasses.replace(eager, cuda_graphs="auto"), Plan("1f1b", 1))
    assert off.step_s < on.step_s and (auto.step_s, auto.graphs) == (off.step_s, False)


def test_auto_replays_where_that_is_faster():
    auto = step_time(C, H100, Setting(1, 4, 1, 64, cuda_graphs="auto"), Plan("1f1b", 8))
    on = step_time(C, H100, Setting(1, 4, 1, 64, cuda_graphs="on"), Plan("1f1b", 8))
    assert (auto.step_s, auto.graphs) == (on.step_s, True)


def test_replayed_stages_keep_every_micro_batch_in_memory():
    """Every micro-batch index has its own graphs and buffers (csrc/executor/graphed_stage.h): a 1F1B pipeline's
    peak holds m micro-batches' activations with graphs, at most pp without."""
    from hybrid_engine.planner.memory import peak_bytes

    L = mlp_shape(8192, 16)
    setting, plan = Setting(1, 4, 1, 1024), Plan("1f1b", 16)
    eager = peak_bytes(L, setting, plan, H100.workspace_bytes)
    replayed = peak_bytes(L, setting, plan, H100.workspace_bytes, replayed=True)
    for rank, (e, r) in enumerate(zip(eager, replayed)):
        assert r.static == e.static and r.dynamic > e.dynamic, rank
    # the first rank held pp (4) micro-batches eagerly; replayed, it holds all 16 and 16 backward graphs' temporaries
    assert replayed[0].dynamic > 3.5 * eager[0].dynamic
    assert choose_peak(L, setting, plan, graphs=True) == replayed and choose_peak(L, setting, plan, False) == eager


def choose_peak(shape, setting: Setting, plan: Plan, graphs: bool):
    """The peaks the planner's prediction carries, with --cuda-graphs on a GPU card or off."""
    from hybrid_engine.planner.choose import predict

    return list(predict(shape, H100, dataclasses.replace(setting, cuda_graphs="on" if graphs else "off"), plan).ranks)


def run_choice(flags: list[str], world: int):
    """The driver's --cuda-graphs choice for a run of `flags` on `world` H100s (planned from this machine)."""
    from hybrid_engine.config.checks import resolve_grid
    from hybrid_engine.models import registry
    from hybrid_engine.parallel.pipeline.graphs import check_run

    merge = [] if "--merge-wgrad" in flags else ["--no-merge-wgrad"]
    cfg = parse_config(flags + ["--virtual-stages", "1", "--lookahead", "0"] + merge)  # the plan, whole
    p = cfg.parallel
    grid = resolve_grid(p.dp, p.pp, p.mp, p.order, world, p.cp)
    return check_run(cfg, registry.build_workload(cfg), grid, "cuda", card=H100)


C_FLAGS = ["--dim", "8192", "--depth", "8", "--batch-size", "64", "--amp", "fp16"]
L_FLAGS = ["--dim", "8192", "--depth", "16", "--batch-size", "1024", "--amp", "fp16"]


def test_auto_asks_the_planner_and_says_both_predictions():
    pp4 = run_choice(C_FLAGS + ["--pp", "4", "--schedule", "1f1b", "--micro-batches", "8"], 4)
    assert pp4.on and pp4.why.startswith("auto: native chain stages' forward and backward replayed per micro-batch, "
                                         "predicted ")
    assert pp4.why.endswith(" eager on H100") and "ms a step replayed" in pp4.why
    dp4 = run_choice(L_FLAGS + ["--dp", "4", "--zero", "1", "--schedule", "1f1b", "--micro-batches", "1"], 4)
    assert not dp4.on and dp4.why.startswith("auto: the eager step is predicted faster, ")
    assert dp4.why.endswith("eager on H100 (the eager backward hides the DP gradient collectives)")
    on = run_choice(L_FLAGS + ["--dp", "4", "--zero", "1", "--schedule", "1f1b", "--micro-batches", "1",
                               "--cuda-graphs", "on"], 4)
    assert on.on and on.why.startswith("--cuda-graphs on")  # asked for: not the planner's to change


def test_the_refit_times_the_running_plan_as_it_runs():
    """The replanner refits the card to the measured steps of the plan as it runs: replayed or eager as the run
    chose, not both ways again (an eager run's host cost a layer is what the refit must see)."""
    from hybrid_engine.parallel.pipeline.graphs import GraphChoice, as_chosen
    from hybrid_engine.planner.step_time import stage_costs

    cfg = parse_config(C_FLAGS)
    assert as_chosen(cfg, GraphChoice(False, "eager")).stages.cuda_graphs == "off"
    assert as_chosen(cfg, GraphChoice(True, "replayed")).stages.cuda_graphs == "on"
    eager = Setting.of(as_chosen(cfg, GraphChoice(False, "eager")), 1, 4, 1)
    counted = stage_costs(C, dataclasses.replace(H100, compute_scale=0.0, host_action_s=1.0), eager, Plan("1f1b", 8))
    assert counted[0][0].F == 2  # two layer actions of the first stage's forward: the host's cost per layer is seen


LLAMA_1B = ["--model", "llama", "--layers", "16", "--hidden", "2048", "--heads", "32", "--kv-heads", "8",
            "--ffn-hidden", "5632", "--seq-len", "2048", "--amp", "bf16", "--optimizer", "adamw",
            "--fused-kernels", "off"]


def llama_1b(flags: list[str], dp: int = 1, pp: int = 1, mp: int = 1):
    from hybrid_engine.planner.model_shape import shape_of

    cfg = parse_config(LLAMA_1B + flags)
    return shape_of(cfg), Setting.of(cfg, dp, pp, mp)


def test_slots_are_the_micro_batches_a_stage_has_in_flight():
    from hybrid_engine.parallel.pipeline.graphs import slots
    from hybrid_engine.parallel.pipeline.schedule import compute_schedule

    pp4 = compute_schedule("1f1b", 4, 8, 1, 0)
    assert [slots(pp4[r], r) for r in range(4)] == [4, 3, 2, 1]  # 1F1B: the warm-up's depth, not the 8 micro-batches
    assert slots(compute_schedule("1f1b", 1, 8, 1, 0)[0], 0) == 1  # one GPU: each micro-batch's B before the next F
    assert slots(compute_schedule("gpipe", 2, 4, 1, 0)[0], 0) == 4  # GPipe: every forward before any backward
    interleaved = compute_schedule("interleaved", 2, 4, 2, 0)
    assert all(1 <= slots(interleaved[0], st) <= 4 for st in (0, 2))


def test_a_transformer_replayed_drops_the_host_work_of_every_layer():
    from hybrid_engine.planner.step_time import AUTOGRAD_ACTION_S

    shape, eager = llama_1b(["--batch-size", "8"], pp=4)
    plan = Plan("1f1b", 8)
    off = step_time(shape, H100, dataclasses.replace(eager, cuda_graphs="off"), plan)
    on = step_time(shape, H100, dataclasses.replace(eager, cuda_graphs="on"), plan)
    assert on.graphs and not off.graphs
    # each of a stage's F and B pays one launch instead of the host's work for each of its layers
    layers = len(shape.cut(4)[0])
    saved = 2 * 8 * (layers * (H100.action_overhead_s + AUTOGRAD_ACTION_S) - H100.action_overhead_s)
    assert off.pipeline_s - on.pipeline_s >= 0.99 * saved


def test_a_transformer_replayed_keeps_one_slot_per_micro_batch_in_flight_not_one_per_micro_batch():
    from hybrid_engine.planner.memory import peak_bytes

    shape, s = llama_1b(["--batch-size", "8"])
    plan = Plan("1f1b", 8)
    eager = peak_bytes(shape, s, plan, H100.workspace_bytes)[0]
    replayed = peak_bytes(shape, s, plan, H100.workspace_bytes, replayed=True)[0]
    # one GPU: one slot, its activations and a layer's temporaries in its forward pool beside the eager backward's
    assert replayed.static == eager.static and eager.dynamic < replayed.dynamic < 1.3 * eager.dynamic
    shape4, s4 = llama_1b(["--batch-size", "8"], pp=4)
    eager4 = peak_bytes(shape4, s4, plan, H100.workspace_bytes)
    replayed4 = peak_bytes(shape4, s4, plan, H100.workspace_bytes, replayed=True)
    for e, r in zip(eager4, replayed4):  # 1F1B: the slots are the micro-batches eager holds at its peak
        assert e.dynamic < r.dynamic < 1.3 * e.dynamic


def test_auto_leaves_a_transformer_eager_where_its_graphs_do_not_fit_and_says_both_numbers():
    from hybrid_engine.config.checks import resolve_grid
    from hybrid_engine.models import registry
    from hybrid_engine.parallel.pipeline.graphs import check_run
    from hybrid_engine.planner.memory import peak_bytes

    flags = LLAMA_1B + ["--batch-size", "16", "--schedule", "gpipe", "--micro-batches", "8",
                        "--virtual-stages", "1", "--lookahead", "0", "--no-merge-wgrad"]
    cfg = parse_config(flags)
    grid = resolve_grid(None, 1, 1, cfg.parallel.order, 1)
    shape, s = llama_1b(["--batch-size", "16"])
    plan = Plan("gpipe", 8)
    eager = max(p.needed for p in peak_bytes(shape, s, plan, H100.workspace_bytes))
    replayed = max(p.needed for p in peak_bytes(shape, s, plan, H100.workspace_bytes, replayed=True))
    assert eager < replayed
    roomy = check_run(cfg, registry.build_workload(cfg), grid, "cuda", card=H100.with_memory(2 * replayed))
    assert roomy.on and roomy.why.startswith("auto: every stage's forward and backward replayed, one slot of graphs "
                                             "per micro-batch in flight, predicted ")
    tight = check_run(cfg, registry.build_workload(cfg), grid, "cuda",
                      card=H100.with_memory((eager + replayed) / 2 / 0.97))
    assert not tight.on and tight.why.startswith("auto: the replayed stages' graphs need ")
    assert "ms a step replayed" in tight.why and tight.why.endswith(" eager on H100")


def test_auto_holds_the_graphs_to_the_memory_cap_not_the_cards_memory():
    """--memory-cap-gib is what a rank may use (an 80 GB card's share on a 141 GB one): auto leaves a transformer
    eager where its graphs fit the card but not the cap, and says the cap."""
    from hybrid_engine.config.checks import resolve_grid
    from hybrid_engine.models import registry
    from hybrid_engine.parallel.pipeline.graphs import check_run
    from hybrid_engine.planner.memory import peak_bytes

    flags = LLAMA_1B + ["--batch-size", "16", "--schedule", "gpipe", "--micro-batches", "8",
                        "--virtual-stages", "1", "--lookahead", "0", "--no-merge-wgrad"]
    shape, s = llama_1b(["--batch-size", "16"])
    plan = Plan("gpipe", 8)
    eager = max(p.needed for p in peak_bytes(shape, s, plan, H100.workspace_bytes))
    replayed = max(p.needed for p in peak_bytes(shape, s, plan, H100.workspace_bytes, replayed=True))
    between_gib = (eager + replayed) / 2 / 0.97 / 2**30
    cfg = parse_config(flags + ["--memory-cap-gib", f"{between_gib:.3f}"])
    grid = resolve_grid(None, 1, 1, cfg.parallel.order, 1)
    capped = check_run(cfg, registry.build_workload(cfg), grid, "cuda", card=H100.with_memory(4 * replayed))
    assert not capped.on and capped.why.startswith("auto: the replayed stages' graphs need "), capped.why
    assert " GiB of --memory-cap-gib, predicted " in capped.why


def test_auto_graphs_a_transformer_across_gpus_as_the_planner_times_it():
    """auto graphs autograd stages across GPUs as on one GPU (the GPU test's two- and four-GPU grids train graphed as
    eagerly), where the planner predicts the replay faster and its pools fit; the planner times them replayed."""
    from hybrid_engine.config.checks import resolve_grid
    from hybrid_engine.models import registry
    from hybrid_engine.parallel.pipeline.graphs import check_run
    from hybrid_engine.planner.step_time import graphed

    flags = LLAMA_1B + ["--batch-size", "16", "--pp", "2", "--schedule", "1f1b", "--micro-batches", "8",
                        "--virtual-stages", "1", "--lookahead", "0", "--no-merge-wgrad"]
    grid = resolve_grid(None, 2, 1, "mp-dp-pp", 2)
    auto = check_run(parse_config(flags), registry.build_workload(parse_config(flags)), grid, "cuda", card=H100)
    assert auto.on and auto.why.startswith("auto: every stage's forward and backward replayed"), auto.why
    assert " ms a step replayed, " in auto.why and auto.why.endswith(" eager on H100")
    off = parse_config(flags + ["--cuda-graphs", "off"])
    assert not check_run(off, registry.build_workload(off), grid, "cuda", card=H100).on
    shape, s = llama_1b(["--batch-size", "16"], pp=2)
    assert graphed(shape, H100, s, Plan("1f1b", 8))
    assert not graphed(shape, H100, dataclasses.replace(s, cuda_graphs="off"), Plan("1f1b", 8))


@pytest.mark.parametrize("flags,why", [
    (["--recompute", "selective"], "selective recompute reruns the attention core inside the backward"),
    (["--cp", "2"], "context parallelism runs its attention's K/V transfers from a host loop"),
    (["--schedule", "zb1", "--merge-wgrad"],
     "--merge-wgrad holds every micro-batch's graphs (activations and stashes) until the step's one W"),
])
def test_on_for_a_transformer_the_run_cannot_graph_is_one_line_before_any_process_group(flags, why):
    from hybrid_engine.config.engine import ConfigError

    world = 4 if "--cp" in flags else 2
    grid = [] if "--cp" in flags else ["--pp", "2"]
    schedule = [] if "--schedule" in flags else ["--schedule", "1f1b"]
    run = LLAMA_1B + ["--batch-size", "8", "--micro-batches", "4"] + grid + schedule + flags
    with pytest.raises(ConfigError) as refused:
        run_choice(run + ["--cuda-graphs", "on"], world)
    assert str(refused.value) == f"--cuda-graphs on: {why}; use --cuda-graphs auto or off"
    auto = run_choice(run + ["--cuda-graphs", "auto"], world)
    assert not auto.on and auto.why == f"auto: {why}"


@pytest.mark.parametrize("flags,grid", [(["--recompute", "selective"], (1, 2, 1)), (["--recompute", "full"], (1, 2, 1)),
                                        (["--cp", "2"], (1, 1, 1))])
def test_transformer_plans_the_graphs_do_not_cover_predict_eager(flags, grid):
    shape, s = llama_1b(["--batch-size", "8"] + flags, *grid)
    plan = Plan("1f1b", 4)
    on = step_time(shape, H100, dataclasses.replace(s, cuda_graphs="on"), plan)
    off = step_time(shape, H100, dataclasses.replace(s, cuda_graphs="off"), plan)
    assert not on.graphs and on.step_s == off.step_s
