"""CUDA-graphed stages: --cuda-graphs auto | on | off, resolved once, before anything is built, and said in one line.

A graphed native chain stage (csrc/executor/graphed_stage.h) captures each micro-batch's F and B as CUDA graphs
and replays them: one launch instead of one per kernel, which is what the course MLP's steps at 4 GPUs were
paying for (the measured step 2-3x its GEMMs' time). What a run must be for it, each a rule here and nowhere else:

  CUDA              the CPU has no graphs (auto: off; on: refused).
  native stages     autograd stages are not graphed; auto graphs the native chains of a run and leaves the rest
                    eager, on needs every stage native.
  no recompute      a recomputed stage reruns its forward inside its backward: nothing to keep static.
  no I and W        a zero-bubble schedule defers weight gradients to W actions that stash the B's tensors.
  ZeRO 0 or 1       ZeRO-2 and 3 release and restore gradient buckets (their addresses move) between writes.
  built-in MSE      the last stage's loss is captured with its forward (any other loss runs through Python).
  no --trace        the trace times every tensor-parallel collective as it launches; a replay launches none.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import hybrid_engine._C as _C
from hybrid_engine.config.engine import ConfigError, GRAPH_MODES, DataParallelConfig, ScheduleConfig, StageConfig
from hybrid_engine.parallel.pipeline.schedule import compute_schedule


@dataclass(frozen=True)
class GraphChoice:
    """The resolved choice: `on` graphs the native chain stages; `why` is the reason said with it."""

    on: bool
    why: str

    def describe(self) -> str:
        return f"CUDA graphs {'on' if self.on else 'off'} ({self.why})"


def splits_backward(schedule: ScheduleConfig, pp: int) -> bool:
    """Whether the schedule splits backwards into I and W actions (zero-bubble)."""
    actions = compute_schedule(schedule.name, pp, schedule.micro_batches, schedule.virtual_stages,
                               schedule.lookahead or 0)
    return any(a.type in (_C.schedule.ActionType.I, _C.schedule.ActionType.W) for rank in actions for a in rank)


def why_not(device_type: str, native_stages: Sequence[bool], schedule: ScheduleConfig, pp: int,
            stages: StageConfig, data_parallel: DataParallelConfig, builtin_loss: bool, trace: bool) -> str:
    """Why this run's native stages cannot be graphed ('' when they can). native_stages: per stage, native."""
    if device_type != "cuda":
        return "the CPU has no CUDA graphs"
    if not any(native_stages):
        return "no native chain stage: autograd stages are not graphed"
    if stages.full_recompute:
        return "recomputed stages rerun their forward inside the backward"
    if splits_backward(schedule, pp):
        return f"schedule {schedule.name} defers weight gradients to W actions, which are not graphed"
    if data_parallel.zero >= 2:
        return f"ZeRO-{data_parallel.zero} moves the gradient buckets between writes"
    if native_stages[-1] and not builtin_loss:
        return "the last stage's loss is not the built-in MSE"
    if trace:
        return "--trace times every tensor-parallel collective as it launches"
    return ""


def resolve(mode: str, device_type: str, native_stages: Sequence[bool], schedule: ScheduleConfig, pp: int,
            stages: StageConfig, data_parallel: DataParallelConfig, builtin_loss: bool,
            trace: bool = False) -> GraphChoice:
    """The run's GraphChoice; ConfigError (one line) for `on` where the run cannot be graphed."""
    if mode not in GRAPH_MODES:
        raise ConfigError(f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return GraphChoice(False, "--cuda-graphs off")
    why = why_not(device_type, native_stages, schedule, pp, stages, data_parallel, builtin_loss, trace)
    if mode == "on":
        autograd = [s for s, native in enumerate(native_stages) if not native]
        if not why and autograd:
            why = (f"stages {', '.join(map(str, autograd))} run" if len(autograd) > 1 else f"stage {autograd[0]} runs"
                   ) + " through autograd"
        if why:
            raise ConfigError(f"--cuda-graphs on: {why}; use --cuda-graphs auto or off")
        return GraphChoice(True, "--cuda-graphs on: every stage's forward and backward replayed per micro-batch")
    if why:
        return GraphChoice(False, f"auto: {why}")
    eager = [s for s, native in enumerate(native_stages) if not native]
    rest = f"; autograd stage{'s' if len(eager) > 1 else ''} {', '.join(map(str, eager))} eager" if eager else ""
    return GraphChoice(True, f"auto: native chain stages' forward and backward replayed per micro-batch{rest}")


def graphed(programs: dict[int, object], choice: GraphChoice, device: str, host_rerun: bool = False
            ) -> dict[int, object]:
    """The programs with every native chain wrapped in its CUDA-graphed form where the choice is on (host_rerun:
    the graphs' plumbing replayed by the host, for tests without a GPU)."""
    if not choice.on:
        return dict(programs)
    return {s: _C.GraphedChainStage(p, device, host_rerun) if isinstance(p, _C.NativeChainStage) else p
            for s, p in programs.items()}


def as_chosen(cfg, choice: GraphChoice):
    """cfg (a RunConfig) with --cuda-graphs the run's resolved choice, on or off: what the planner times the running
    plan by when it refits to the measured steps."""
    return dataclasses.replace(cfg, stages=dataclasses.replace(cfg.stages, cuda_graphs="on" if choice.on else "off"))


def check_run(cfg, workload, grid, device_type: str, card=None) -> GraphChoice:
    """The run's choice, from the configuration and the (meta) model before any process group exists, so that
    --cuda-graphs on where the run cannot be graphed ends it with one line and exit 2 before the first collective.
    auto, where the run can be graphed: the planner's verdict on the run's plan (`planned`) on `card` (None: this
    device's). The driver hands the choice to the engine, which says it."""
    from hybrid_engine.models import losses
    from hybrid_engine.parallel.pipeline.partition import partition
    from hybrid_engine.parallel.pipeline.stages import plan_stages
    from hybrid_engine.parallel.tensor.layers import parallelize_mlp
    from hybrid_engine.planner.card import this_device

    num_stages = grid.pp_size * cfg.schedule.virtual_stages
    model = workload.engine_kwargs(num_stages)
    layout = model["layout"] if model["layout"] is not None else partition(workload.model, num_stages)
    plans = plan_stages(workload.model, layout, grid.mp_size, cfg.precision, cfg.stages,
                        tp_chains=model["parallelize"] is parallelize_mlp)
    choice = resolve(cfg.stages.cuda_graphs, device_type, [p.native for p in plans], cfg.schedule, grid.pp_size,
                     cfg.stages, cfg.data_parallel, losses.is_builtin(workload.loss), cfg.reporting.trace is not None)
    if not choice.on or cfg.stages.cuda_graphs != "auto" or not all(p.native for p in plans):
        return choice
    return planned(cfg, grid, card or this_device(cfg.plan.card, device_type)) or choice


def planned(cfg, grid, card) -> GraphChoice | None:
    """auto for a run of native stages: replayed if the planner predicts the run's plan faster so (each action one
    launch instead of one per layer, against the DP gradient collectives a replayed backward no longer hides),
    else eager; both predictions said. None where the planner times no replay on `card`."""
    from hybrid_engine.planner.candidates import Plan
    from hybrid_engine.planner.model_shape import shape_of
    from hybrid_engine.planner.setting import Setting
    from hybrid_engine.planner.step_time import step_time

    s = Setting.of(cfg, grid.dp_size, grid.pp_size, grid.mp_size)
    c = cfg.schedule
    plan = Plan(c.name, c.micro_batches, c.virtual_stages, c.lookahead or 0, bool(c.merge_weight_grads))
    shape = shape_of(cfg)
    replayed = step_time(shape, card, dataclasses.replace(s, cuda_graphs="on"), plan)
    eager = step_time(shape, card, dataclasses.replace(s, cuda_graphs="off"), plan)
    if not replayed.graphs:
        return None
    times = f"{replayed.step_s * 1e3:.3g} ms a step replayed, {eager.step_s * 1e3:.3g} eager on {card.name}"
    if replayed.step_s <= eager.step_s:
        return GraphChoice(True, f"auto: native chain stages' forward and backward replayed per micro-batch, "
                                 f"predicted {times}")
    hides = eager.dp_exposed_s < replayed.dp_exposed_s
    hid = " (the eager backward hides the DP gradient collectives)" if hides else ""
    return GraphChoice(False, f"auto: the eager step is predicted faster, {times}{hid}")
