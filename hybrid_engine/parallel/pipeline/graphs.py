"""CUDA-graphed stages: --cuda-graphs auto | on | off, resolved once, before anything is built, and said in one line.

A graphed stage captures F and B as CUDA graphs and replays them: one launch instead of one per kernel, which is
what the course MLP's steps at 4 GPUs paid for (the measured step 2-3x its GEMMs' time), and what a transformer
stage pays again in Python and launches for every operation. Native chain stages
(csrc/executor/graphed_stage.h) keep graphs per micro-batch index; autograd stages, the GPT's and the Llama's
(csrc/executor/graphed_autograd_stage.h), keep one slot of graphs per micro-batch in flight at once (`slots`),
reused by micro-batches whose lifetimes do not overlap. Under a zero-bubble schedule an autograd stage replays its
I (the input gradient, its weight gradients stashed over the slot's buffers) and runs W eagerly from those
stashes; the slot is held from F to W. The tensor-parallel and sequence-parallel collectives run inside the graphs;
the P2P transfers and the DP collectives outside. What a run must be for it, each a rule here and nowhere else:

  CUDA              the CPU has no graphs (auto: off; on: refused).
  no recompute      a recomputed stage reruns its forward (full) or its attention core (selective) inside its
                    backward: nothing to keep static.
  I and W: autograd a zero-bubble schedule's I is graphed and its W runs eagerly from the I's stashes; a native
    stages only     chain stage's graphs compute the whole backward, so its I and W are refused.
  no merged W       --merge-wgrad computes every micro-batch's weight gradients at the step's end, so every
                    micro-batch would hold a slot of graphs (its activations and stashes) until then.
  ZeRO 0 or 1       ZeRO-2 and 3 release and restore gradient buckets (their addresses move) between writes.
  no context        context parallelism's attention runs its ring of K/V transfers from a host loop.
    parallelism
  built-in MSE      a native last stage's loss is captured with its forward (any other loss runs through Python;
                    an autograd last stage captures any loss with its forward).
  no --trace        the trace times every tensor-parallel collective as it launches; a replay launches none.

Random numbers: torch's CUDA graph registers the default CUDA generator at capture, so a dropout replays with
fresh numbers each replay (the engine's GPT and Llama have none).
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
    """The resolved choice: `on` graphs the stages; `why` is the reason said with it."""

    on: bool
    why: str

    def describe(self) -> str:
        return f"CUDA graphs {'on' if self.on else 'off'} ({self.why})"


def splits_backward(schedule: ScheduleConfig, pp: int) -> bool:
    """Whether the schedule splits backwards into I and W actions (zero-bubble)."""
    actions = compute_schedule(schedule.name, pp, schedule.micro_batches, schedule.virtual_stages,
                               schedule.lookahead or 0)
    return any(a.type in (_C.schedule.ActionType.I, _C.schedule.ActionType.W) for rank in actions for a in rank)


@dataclass(frozen=True)
class GraphFacts:
    """What decides whether a run's stages can be graphed: facts the engine (`resolve`) and the planner
    (planner/step_time.graphed) both hold, so that both ask `why_not` of them."""

    gpu: bool
    """The stages run on a CUDA device."""
    native_stages: tuple[bool, ...]
    """Per stage: a native chain stage (else an autograd one)."""
    schedule: ScheduleConfig
    """Whether it splits the backwards into I and W (zero-bubble), and merges the W (merge_weight_grads)."""
    pp: int
    full_recompute: bool = False
    selective_recompute: bool = False
    """The decoders' attention core rerun in the backward."""
    zero: int = 0
    cp: int = 1
    builtin_loss: bool = True
    """The run's loss is the engine's built-in MSE (models/losses.py)."""
    trace: bool = False


def why_not(facts: GraphFacts) -> str:
    """Why a run of these facts cannot have its stages graphed ('' when it can)."""
    if not facts.gpu:
        return "the CPU has no CUDA graphs"
    if facts.full_recompute:
        return "recomputed stages rerun their forward inside the backward"
    if facts.selective_recompute and not all(facts.native_stages):
        return "selective recompute reruns the attention core inside the backward"
    if splits_backward(facts.schedule, facts.pp):
        if any(facts.native_stages):
            return (f"schedule {facts.schedule.name} defers weight gradients to W actions, which native chain "
                    "stages' graphs do not split off")
        if facts.schedule.merge_weight_grads:
            return ("--merge-wgrad holds every micro-batch's graphs (activations and stashes) until the step's "
                    "one W")
    if facts.zero >= 2:
        return f"ZeRO-{facts.zero} moves the gradient buckets between writes"
    if facts.cp > 1:
        return "context parallelism runs its attention's K/V transfers from a host loop"
    if facts.native_stages[-1] and not facts.builtin_loss:
        return "the last stage's loss is not the built-in MSE"
    if facts.trace:
        return "--trace times every tensor-parallel collective as it launches"
    return ""


def replays(native_stages: Sequence[bool], split: bool = False) -> str:
    """What a run of these stages replays, as the choice's line says it (split: the schedule has I and W)."""
    if all(native_stages):
        return "native chain stages' forward and backward replayed per micro-batch"
    if not any(native_stages):
        if split:
            return ("every stage's forward and input gradient (I) replayed, one slot of graphs per micro-batch in "
                    "flight until its W, the weight gradients (W) eager")
        return "every stage's forward and backward replayed, one slot of graphs per micro-batch in flight"
    return ("native chain stages' forward and backward replayed per micro-batch, autograd stages' one slot of "
            "graphs per micro-batch in flight")


def resolve(mode: str, device_type: str, native_stages: Sequence[bool], schedule: ScheduleConfig, pp: int,
            stages: StageConfig, data_parallel: DataParallelConfig, builtin_loss: bool,
            trace: bool = False, cp: int = 1) -> GraphChoice:
    """The run's GraphChoice; ConfigError (one line) for `on` where the run cannot be graphed."""
    if mode not in GRAPH_MODES:
        raise ConfigError(f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return GraphChoice(False, "--cuda-graphs off")
    why = why_not(GraphFacts(device_type == "cuda", tuple(native_stages), schedule, pp, stages.full_recompute,
                             stages.recompute == "selective", data_parallel.zero, cp, builtin_loss, trace))
    if mode == "on" and why:
        raise ConfigError(f"--cuda-graphs on: {why}; use --cuda-graphs auto or off")
    if why:
        return GraphChoice(False, f"auto: {why}")
    what = replays(native_stages, splits_backward(schedule, pp))
    return GraphChoice(True, f"--cuda-graphs on: {what}" if mode == "on" else f"auto: {what}")


def slots(actions: Sequence, stage: int) -> int:
    """The slots of graphs a graphed autograd stage keeps on the rank whose compute actions (F, B, I, W, in order)
    these are: the most of its micro-batches in flight at once, each from its F to its B, or to its W after an I
    (the W reads the stashes the slot's buffers hold). The executor's stage takes the lowest free slot at each F
    (csrc/executor/graphed_autograd_stage.h), which needs exactly this many. A merged W (the step's last) is
    refused (`why_not`), so each W here ends its own micro-batch's lifetime."""
    in_flight = most = 0
    for a in actions:
        if a.stage != stage:
            continue
        if a.type.name == "F":
            in_flight += 1
            most = max(most, in_flight)
        elif a.type.name in ("B", "W"):
            in_flight -= 1
    return most


def graphed(programs: dict[int, object], choice: GraphChoice, device: str, host_rerun: bool = False,
            grads=None, stage_params: dict[int, list] | None = None, param_gather=None) -> dict[int, object]:
    """The programs with every stage wrapped in its CUDA-graphed form where the choice is on (host_rerun: the
    graphs' plumbing replayed by the host, for tests without a GPU). An autograd stage needs the engine's GradBuffer
    (`grads`), its parameters (`stage_params[stage]`) and ZeRO-1's overlapped gathers (`param_gather`, or None)."""
    if not choice.on:
        return dict(programs)
    out = {}
    for s, p in programs.items():
        if isinstance(p, _C.NativeChainStage):
            out[s] = _C.GraphedChainStage(p, device, host_rerun)
        elif isinstance(p, _C.AutogradStage):
            if grads is None:
                raise ValueError("graphed: an autograd stage needs the engine's GradBuffer")
            out[s] = _C.GraphedAutogradStage(p, grads, list((stage_params or {}).get(s, [])), param_gather, device,
                                             host_rerun)
        else:
            out[s] = p
    return out


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
    from hybrid_engine.parallel.pipeline.stages import plan_stages
    from hybrid_engine.parallel.pipeline.units import stage_units
    from hybrid_engine.parallel.tensor.layers import parallelize_mlp
    from hybrid_engine.planner.card import this_device

    num_stages = grid.pp_size * cfg.schedule.virtual_stages
    model = workload.engine_kwargs(num_stages, grid.pp_size, cfg.schedule.placement)
    units, layout, _ = stage_units(workload.model, model["layout"], num_stages)
    plans = plan_stages(units, layout, grid.mp_size, cfg.precision, cfg.stages,
                        tp_chains=model["parallelize"] is parallelize_mlp)
    native = [p.native for p in plans]
    choice = resolve(cfg.stages.cuda_graphs, device_type, native, cfg.schedule, grid.pp_size, cfg.stages,
                     cfg.data_parallel, losses.is_builtin(workload.loss), cfg.reporting.trace is not None,
                     grid.cp_size)
    if not choice.on or cfg.stages.cuda_graphs != "auto":
        return choice
    return planned(cfg, grid, card or this_device(cfg.plan.card, device_type)) or choice


def planned(cfg, grid, card) -> GraphChoice | None:
    """auto: replayed if the planner predicts the run's plan faster so (each action one launch instead of one per
    layer, against the DP gradient collectives a replayed backward no longer hides) and its replayed stages' memory
    (graph pools held through the run) fits what a rank may use (--memory-cap-gib, else the card's memory), else
    eager; both predictions said. None where the planner times no replay on `card`."""
    from hybrid_engine.planner.candidates import Plan
    from hybrid_engine.planner.memory import fits, peak_bytes
    from hybrid_engine.planner.model_shape import shape_of
    from hybrid_engine.planner.run_plan import run_cap
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
    if replayed.step_s > eager.step_s:
        hides = eager.dp_exposed_s < replayed.dp_exposed_s
        hid = " (the eager backward hides the DP gradient collectives)" if hides else ""
        return GraphChoice(False, f"auto: the eager step is predicted faster, {times}{hid}")
    peaks = peak_bytes(shape, s, plan, card.workspace_bytes, replayed=True)
    cap = run_cap(cfg, card)
    if not fits(peaks, cap) and fits(peak_bytes(shape, s, plan, card.workspace_bytes), cap):
        need = max(p.needed for p in peaks) / 2**30
        of = "--memory-cap-gib" if cfg.parallel.memory_cap_gib is not None else card.name
        return GraphChoice(False, f"auto: the replayed stages' graphs need {need:.3g} GiB of the "
                                  f"{cap / 2**30:.3g} GiB of {of}, predicted {times}")
    return GraphChoice(True, f"auto: {replays([shape.native], splits_backward(c, grid.pp_size))}, predicted {times}")
