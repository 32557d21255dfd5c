"""CUDA-graphed native stages (csrc/executor/graphed_stage.h, hybrid_engine/parallel/pipeline/graphs.py) without a
GPU: the choice of --cuda-graphs and its one line, and the graphs' plumbing -- static buffers per micro-batch,
the loss multiplier read from a device scalar, the final-gradient announcements after B -- with the recorded host
code replayed in place of the CUDA graph, which must train bit for bit like the eager chain on every grid and
schedule the graphs allow."""
from __future__ import annotations

import pytest

from dist_utils import run_ranks
from graph_runs import train
from hybrid_engine.config.engine import ConfigError, DataParallelConfig, ScheduleConfig, StageConfig
from hybrid_engine.parallel.pipeline.graphs import resolve

ONE_F_ONE_B = ScheduleConfig("1f1b", 4)


def choose(mode: str, device: str = "cuda", native=(True, True), schedule=ONE_F_ONE_B, stages=StageConfig(),
           zero: int = 0, builtin_loss: bool = True, trace: bool = False, cp: int = 1):
    return resolve(mode, device, list(native), schedule, 2, stages, DataParallelConfig(zero=zero), builtin_loss,
                   trace, cp)


def test_auto_is_on_for_native_chains_on_cuda_and_off_on_the_cpu_with_its_reason():
    assert choose("auto").on
    assert choose("auto").describe().startswith("CUDA graphs on (auto: native chain stages' forward and backward")
    off = choose("auto", device="cpu")
    assert not off.on and off.describe() == "CUDA graphs off (auto: the CPU has no CUDA graphs)"
    assert choose("off").describe() == "CUDA graphs off (--cuda-graphs off)"
    # autograd stages are graphed too, in slots of graphs (tests/parallel/test_graphed_decoders.py)
    mixed = choose("auto", native=(True, False))
    assert mixed.on and mixed.why == ("auto: native chain stages' forward and backward replayed per micro-batch, "
                                      "autograd stages' one slot of graphs per micro-batch in flight")
    decoders = choose("on", native=(False, False), builtin_loss=False)
    assert decoders.why == ("--cuda-graphs on: every stage's forward and backward replayed, one slot of graphs per "
                            "micro-batch in flight")
    # a zero-bubble schedule's autograd stages replay their I, their W eager
    zbv = choose("auto", native=(False, False), schedule=ScheduleConfig("zbv", 4, 2))
    assert zbv.on and zbv.why == ("auto: every stage's forward and input gradient (I) replayed, one slot of graphs "
                                  "per micro-batch in flight until its W, the weight gradients (W) eager")


@pytest.mark.parametrize("why,kwargs", [
    ("the CPU has no CUDA graphs", {"device": "cpu"}),
    ("recomputed stages rerun their forward inside the backward", {"stages": StageConfig(recompute="full")}),
    ("recomputed stages rerun their forward inside the backward",
     {"stages": StageConfig(recompute="full"), "native": (False, False)}),
    ("selective recompute reruns the attention core inside the backward",
     {"stages": StageConfig(recompute="selective"), "native": (False, False)}),
    ("schedule zb1 defers weight gradients to W actions, which native chain stages' graphs do not split off",
     {"schedule": ScheduleConfig("zb1", 4)}),
    ("schedule zbv defers weight gradients to W actions, which native chain stages' graphs do not split off",
     {"schedule": ScheduleConfig("zbv", 4, 2), "native": (False, True)}),
    ("ZeRO-2 moves the gradient buckets between writes", {"zero": 2}),
    ("ZeRO-3 moves the gradient buckets between writes", {"zero": 3, "native": (False, False)}),
    ("context parallelism runs its attention's K/V transfers from a host loop", {"cp": 2, "native": (False, False)}),
    ("--merge-wgrad holds every micro-batch's graphs (activations and stashes) until the step's one W",
     {"schedule": ScheduleConfig("zbv", 4, 2, 0, True), "native": (False, False)}),
    ("the last stage's loss is not the built-in MSE", {"builtin_loss": False}),
    ("--trace times every tensor-parallel collective as it launches", {"trace": True}),
    ("--trace times every tensor-parallel collective as it launches",
     {"trace": True, "native": (False, False), "builtin_loss": False}),
])
def test_on_where_the_run_cannot_be_graphed_is_one_line(why, kwargs):
    with pytest.raises(ConfigError) as refused:
        choose("on", **kwargs)
    assert str(refused.value) == f"--cuda-graphs on: {why}; use --cuda-graphs auto or off"
    assert not choose("auto", **kwargs).on and choose("auto", **kwargs).why == f"auto: {why}"


def test_an_unknown_mode_is_refused():
    with pytest.raises(ConfigError, match="--cuda-graphs must be one of auto, on, off, got 'yes'"):
        choose("yes")
    with pytest.raises(ConfigError, match=r"stages.cuda_graphs \(--cuda-graphs\) must be one of auto, on, off"):
        StageConfig(cuda_graphs="yes").validate()


GRIDS = {
    "pp2 1f1b": {"pp": 2},
    "pp2 gpipe": {"pp": 2, "schedule": "gpipe"},
    "pp2 interleaved": {"pp": 2, "schedule": "interleaved", "v": 2},
    "pp2 one micro-batch (gradients overwritten)": {"pp": 2, "m": 1},
    "dp2": {"dp": 2},
    "dp2 ZeRO-1": {"dp": 2, "zero": 1},
    "mp2": {"mp": 2},
    "pp2 fp16 half weights": {"pp": 2, "amp": "fp16"},
    "mp2 bf16 half weights": {"mp": 2, "amp": "bf16"},
}


@pytest.fixture(scope="module")
def host_replayed():
    runs = [dict(grid, graphs=graphs) for grid in GRIDS.values() for graphs in ("host", "off")]
    return run_ranks(2, train, runs, timeout=300)


@pytest.mark.parametrize("index,name", list(enumerate(GRIDS)))
def test_replayed_stages_train_bit_for_bit_like_the_eager_chain(host_replayed, index, name):
    for rank_runs in host_replayed:
        replayed, eager = rank_runs[2 * index], rank_runs[2 * index + 1]
        assert replayed["losses"] == eager["losses"], name
        assert replayed["scales"] == eager["scales"] and replayed["skipped"] == eager["skipped"], name
        assert replayed["state"].keys() == eager["state"].keys()
        for key in eager["state"]:
            assert (replayed["state"][key] == eager["state"][key]).all(), (name, key)
        # every stage of the rank: the first step eager, each later one replays every micro-batch's F and B
        m = GRIDS[name].get("m", 4)
        stages = GRIDS[name].get("v", 1)
        assert len(replayed["counts"]) == stages and eager["counts"] == [], name
        for captures, replays in replayed["counts"]:
            assert captures == 2 * m and replays == 2 * m * (len(eager["losses"]) - 1), name
        # the engine's close freed every graph of the programs the run still held
        assert replayed["slots_after_close"] == [0] * stages, name


def test_fp16_runs_change_the_scale_between_replays(host_replayed):
    """The fp16 grid is only a test of the device multiplier if the scale moved (grew, or backed off)."""
    fp16 = host_replayed[0][2 * list(GRIDS).index("pp2 fp16 half weights")]
    assert len(set(fp16["scales"])) > 2, fp16["scales"]


def test_a_new_shape_runs_eagerly_and_is_captured_again_and_each_target_is_drawn_once():
    from graph_runs import train_changing_shapes

    [replayed], [eager] = (run_ranks(1, train_changing_shapes, graphs, timeout=120) for graphs in ("host", "off"))
    assert replayed["losses"] == eager["losses"]
    for key in eager["state"]:
        assert (replayed["state"][key] == eager["state"][key]).all(), key
    # captured at the start of steps 1 (32 rows, seen in step 0) and 3 (16 rows, seen in step 2), 2 micro-batches x
    # F and B each; step 4's 32 rows ran eagerly again
    assert replayed["counts"] == 2 * 2 * 2
    # the targets once each (the graphed stage draws them before it knows its path); the inputs as eagerly (the
    # engine's first step also draws micro-batch 0 for the shapes)
    targets = [d for d in replayed["draws"] if d[0] == "target"]
    assert sorted(targets) == [("target", step, micro) for step in range(5) for micro in range(2)]
    assert replayed["draws"] == eager["draws"]


def test_the_flag_and_the_toml_key_set_the_stage_field(tmp_path):
    from hybrid_engine.models import registry
    from hybrid_engine.train.cli import build_parser, parse_config

    assert parse_config([]).stages.cuda_graphs == "auto"
    assert parse_config(["--cuda-graphs", "off"]).stages.cuda_graphs == "off"
    path = tmp_path / "run.toml"
    path.write_text('[stages]\ncuda_graphs = "on"\n')
    assert parse_config(["--config", str(path)]).stages.cuda_graphs == "on"
    path.write_text('[stages]\ncuda_graphs = "sometimes"\n')  # a file's value is held to the flag's choices
    with pytest.raises(ConfigError, match=r"stages.cuda_graphs \(--cuda-graphs\) must be one of auto, on, off"):
        parse_config(["--config", str(path)]).validate(1, "cpu", registry.check_model)
    help_text = " ".join(build_parser().format_help().split())  # the field's docstring is the flag's help
    assert ("--cuda-graphs {auto,on,off} Capture each stage's forward and backward as CUDA graphs and replay them"
            in help_text)


FOUR_RANK_GRIDS = {
    "pp4 1f1b": {"pp": 4, "m": 8},
    "pp2 x mp2": {"pp": 2, "mp": 2},
    "dp2 x pp2 interleaved": {"dp": 2, "pp": 2, "schedule": "interleaved", "v": 2},
    "dp2 x mp2 ZeRO-1": {"dp": 2, "mp": 2, "zero": 1},
}


def test_replayed_stages_train_bit_for_bit_on_four_rank_grids():
    runs = [dict(grid, graphs=graphs) for grid in FOUR_RANK_GRIDS.values() for graphs in ("host", "off")]
    for rank_runs in run_ranks(4, train, runs, timeout=300):
        for index, name in enumerate(FOUR_RANK_GRIDS):
            replayed, eager = rank_runs[2 * index], rank_runs[2 * index + 1]
            assert replayed["losses"] == eager["losses"], name
            for key in eager["state"]:
                assert (replayed["state"][key] == eager["state"][key]).all(), (name, key)
            m = FOUR_RANK_GRIDS[name].get("m", 4)
            assert len(replayed["counts"]) == FOUR_RANK_GRIDS[name].get("v", 1), name
            assert all(c == (2 * m, 2 * m * (len(eager["losses"]) - 1)) for c in replayed["counts"]), name


def test_a_reschedule_to_a_schedule_with_w_actions_goes_back_to_the_eager_programs():
    from graph_runs import train_rescheduled

    replayed, eager = (run_ranks(2, train_rescheduled, graphs, timeout=120) for graphs in ("host", "off"))
    for r, e in zip(replayed, eager):
        assert r["losses"] == e["losses"]
        assert r["kinds"] == [["GraphedChainStage"]] * 2 + [["NativeChainStage"]] * 2
        assert e["kinds"] == [["NativeChainStage"]] * 4
        assert r["graphs"] == e["graphs"] == "CUDA graphs off (auto: the CPU has no CUDA graphs)"
