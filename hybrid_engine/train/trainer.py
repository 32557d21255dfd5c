"""The training loop, apart from the command line: data -> engine.train_step -> metrics -> checkpoint cadence.

    workload = registry.build_workload(cfg, device)  # the model of the registry: model, loss, stage cut, data
    engine = build_engine(cfg, workload, groups, device)
    Trainer(cfg, engine, workload, grid, groups, device).train(start_from)

Every rank runs the same loop: step t's data is drawn from (seed, t) alone, only where it is consumed (inputs on
the first stage, targets on the last); the loss comes back all-reduced, so a non-finite loss stops every rank at
the same step. Rank 0 reports (hybrid_engine/train/progress.py).
"""
from __future__ import annotations

import dataclasses
import os
import resource
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybrid_engine import checkpoint
from hybrid_engine import optim
from hybrid_engine.runtime import faults
from hybrid_engine.metrics import flops
from hybrid_engine.config.checks import parse_betas
from hybrid_engine.config.run import RunConfig
from hybrid_engine.engine.engine import Engine
from hybrid_engine.runtime.fault_plan import FaultPlan
from hybrid_engine.parallel.grid import GridGroups
from hybrid_engine.parallel.pipeline.graphs import GraphChoice
from hybrid_engine.models import registry
from hybrid_engine.models.workload import Workload
from .divergence import DivergenceGuard
from hybrid_engine.config.output_paths import ReportingError
from .lr_schedule import LRSchedule
from .graph_fallback import step_or_run_eagerly
from .plan_fallback import FirstStepOutOfMemory
from . import learn_plan
from .update_settings import update_settings
from .progress import Progress, flops_text, summary_line
from hybrid_engine.planner.run_plan import compare_text
from hybrid_engine.checkpoint.runs import RunCheckpoints
from hybrid_engine.metrics.trace import comm_spans_of, gather_pipeline_rows, spans_of, write_trace


class TrainingStopped(Exception):
    """Training cannot go on (a non-finite loss); every rank finds it at the same step (the loss is all-reduced)."""


@dataclass
class RunState:
    """Where the run is, for whoever must report it from outside the loop (a Ctrl-C or SIGTERM handler)."""

    step: int | None = None
    """The step being run; None before the first."""
    last_checkpoint: str | None = None
    """The newest published checkpoint of this run's lineage (the one it started from, or published since)."""
    save: str | None = None
    """The run's --save directory, whose `latest` is the truth when a report is made (rank 0 publishes; another
    rank stopped meanwhile may not have heard of it yet)."""
    hang: object | None = None
    """What the pipeline executor waits on (runtime/hang_report.HangReport), once the engine exists."""

    def where(self) -> tuple[str, str] | None:
        """(long, short) description of the wait the running step is in, or None outside a step."""
        return self.hang.where() if self.hang is not None else None

    def describe(self) -> str:
        where = "before the first step" if self.step is None else f"at step {self.step}"
        latest = checkpoint.pointed_to(self.save) if self.save else None
        return f"{where}; last checkpoint {latest or self.last_checkpoint or 'none'}"


def build_engine(cfg: RunConfig, workload: Workload, groups: GridGroups, device: torch.device,
                 cuda_graphs: GraphChoice | None = None) -> Engine:
    """The one place a run's configuration becomes an Engine (each rank builds only its own stages); a --clip-grad
    left unsaid is the model's default, its registry entry's (the engine announces it); cuda_graphs: the run's
    resolved --cuda-graphs (None: the engine resolves it)."""
    o, precision = cfg.optimizer, cfg.precision
    if precision.clip_grad is None:
        precision = dataclasses.replace(precision, clip_grad=registry.entry(cfg.model.name).clip_grad)
    factory = optim.from_name(o.name, o.lr, parse_betas(o.betas) if o.betas else None, o.weight_decay)
    return Engine(workload.model, workload.loss, groups, optimizer=factory, schedule=cfg.schedule,
                  stages=cfg.stages, precision=precision, data_parallel=cfg.data_parallel, device=device,
                  trace=cfg.reporting.trace is not None, cp_comm=cfg.parallel.cp_comm, plan_card=cfg.plan.card,
                  cuda_graphs=cuda_graphs, cp_kernel=cfg.parallel.cp_kernel,
                  **workload.engine_kwargs(groups.grid.pp_size * cfg.schedule.virtual_stages, groups.grid.pp_size,
                                           cfg.schedule.placement))


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def peak_reserved_gib(device: torch.device) -> float:
    """What the caching allocator held at its most (CUDA; the planner's allocator overhead is fitted from it beside
    the allocated peak); the process's resident peak elsewhere, where nothing caches."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2**30
    return peak_memory_gib(device)


def gather_per_rank(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `values` (same length everywhere), by rank: one small all-gather."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [x.tolist() for x in out]


def micro_batch_sources(workload: Workload, step: int, first_row: int, rows: int, engine: Engine,
                        dtype: torch.dtype, device: torch.device, poison: bool):
    """(inputs, targets) for streamed data: callables micro -> that micro-batch's rows of this DP rank, drawn
    when the engine's forward asks (the same values as slicing the whole draw), or None where the rank
    consumes none. `poison` fills the inputs with NaN (FaultPlan.nan_at_step)."""
    chunks = (engine.groups.coords.cp, engine.grid.cp_size)  # a context-parallel rank's tokens only

    def rows_of(micro: int) -> tuple[int, int]:
        return first_row + micro * rows, first_row + (micro + 1) * rows

    def inputs(micro: int) -> torch.Tensor:
        x = workload.draw(step, *rows_of(micro), targets=False, dtype=dtype, device=device, chunks=chunks)[0]
        return x.fill_(float("nan")) if poison and x.is_floating_point() else x

    def targets(micro: int) -> torch.Tensor:
        return workload.draw(step, *rows_of(micro), inputs=False, dtype=dtype, device=device, chunks=chunks)[1]

    return (inputs if engine.holds_first_stage else None), (targets if engine.holds_last_stage else None)


def _failure_code(progress: Progress) -> float:
    """A report rank 0 could not write, as one number every rank can turn into the same line: 2 errno + (1 for the
    trace, 0 for the metrics file); 0 when none failed."""
    if progress.failed is None:
        return 0.0
    what, err = progress.failed
    return float(2 * err + what.startswith("--trace"))


class Trainer:
    """Runs the configured steps on one rank of the grid; every rank constructs one and calls `train`."""

    def __init__(self, cfg: RunConfig, engine: Engine, workload: Workload, grid, groups: GridGroups,
                 device: torch.device, *, faults_plan: FaultPlan = FaultPlan(), state: RunState | None = None,
                 predicted=None, fallback: bool = False, replanner=None):
        self.cfg, self.engine, self.workload, self.grid, self.groups = cfg, engine, workload, grid, groups
        self.device = device
        self.rank = dist.get_rank()
        self.faults = faults_plan
        self.predicted = predicted  # the planner's Prediction of this run's plan: the summary sets it beside the run
        self.fallback = fallback  # the plan is the planner's: out of memory on the first step, it takes another
        self.replanner = replanner  # the planner's inputs: its cost model refitted after the first measured steps
        self.state = state if state is not None else RunState()
        self.per_dp = cfg.data.batch_size // grid.dp_size
        self.chunks = (groups.coords.cp, grid.cp_size)  # a context-parallel rank draws its chunks' tokens only
        self.data_dtype = engine.precision.half_dtype if engine.precision.half_weights else torch.float32

    def train(self, start_from: checkpoint.Checkpoint | None = None) -> None:
        cfg, engine, steps = self.cfg, self.engine, self.cfg.training.steps
        progress = Progress(self.rank, steps=steps, batch_size=cfg.data.batch_size,
                            log_every=cfg.training.log_every, quiet=cfg.reporting.quiet,
                            metrics=cfg.reporting.metrics, append=start_from is not None,
                            tensorboard=cfg.reporting.tensorboard)
        self.state.save = cfg.checkpoint.save
        schedule = LRSchedule.of(cfg.optimizer, steps)
        ckpts = RunCheckpoints(cfg, engine, self.workload, self.state, progress, self.rank, self.faults,
                               settings=update_settings(cfg, registry.entry(cfg.model.name).clip_grad))
        first_step = ckpts.start(start_from)
        if schedule.warmup or schedule.decay != "constant":
            progress.say(f"lr schedule: {schedule.describe()}")
        guard = DivergenceGuard(cfg.training.spike_factor)
        times: list[float] = []
        peaks: list[float] = []
        try:
            for step in range(first_step, steps):
                self.state.step = step
                lr = schedule.at(step)
                engine.set_lr(lr)
                result = (self._first_step(step) if step == first_step else
                          step_or_run_eagerly(self._step, step, engine, cfg.stages.cuda_graphs, self.grid.world_size,
                                              progress.say))
                self._judge(step, result.loss, guard, ckpts)
                ckpts.publish_written()  # its state just trained one step with a finite loss, no spike
                # per rank: peak memory, and the bytes of fp32 masters and optimizer state it holds (ZeRO-1: a shard)
                # and whether rank 0 could write the last report (all ranks stop alike if not)
                memory = gather_per_rank([peak_memory_gib(self.device), engine.master_bytes(),
                                          engine.optimizer_state_bytes(), peak_reserved_gib(self.device),
                                          _failure_code(progress)], self.device)
                self._stop_if_a_report_failed([failed for *_, failed in memory])
                peaks = [round(peak, 3) for peak, *_ in memory]
                if step >= first_step + cfg.training.warmup:  # this run's first steps are its warm-up
                    times.append(result.step_time_s)
                predicted = ({} if self.predicted is None else
                             {"predicted_step_time_s": float(f"{self.predicted.step_s:.6g}"),
                              "predicted_peak_mem_gib": float(f"{self.predicted.peak / 2**30:.4g}")})
                progress.step({"step": step, "loss": result.loss, "step_time_s": round(result.step_time_s, 6),
                               **predicted,
                               "samples_per_s": round(cfg.data.batch_size / result.step_time_s, 1),
                               **self._throughput(result.step_time_s),
                               "peak_mem_gib": peaks, "peak_reserved_gib": [round(r, 3) for *_, r, _ in memory],
                               "master_bytes": [int(m) for _, m, *_ in memory],
                               "optimizer_state_bytes": [int(o) for _, _, o, *_ in memory],
                               "loss_scale": result.loss_scale, "skipped": result.skipped,
                               "grad_norm": result.grad_norm, "lr": lr})
                if self.replanner is not None and learn_plan.due(step, first_step, cfg.training.warmup, steps):
                    if self._learn_plan(step, times, progress):
                        cfg = self.cfg
                        times.clear()  # the summary measures the plan it names
                self._maybe_validate(step + 1, progress)
                ckpts.maybe_write(step + 1)
            if ckpts.written is not None:  # the last checkpoint: its state's loss on the next step's batch
                self._judge(steps, self._probe(steps), guard, ckpts, probe=True)
                ckpts.publish_written()
            if start_from and first_step >= steps:
                progress.say(f"nothing to do: the checkpoint is at step {first_step}, --steps is {steps}")
            ran = max(0, steps - first_step)
            if ran:
                line = summary_line(self.grid, cfg.schedule.name, cfg.data.batch_size, times,
                                    min(ran, cfg.training.warmup), peaks)
                if times:
                    t = self._throughput(statistics.median(times))
                    mfu = f", MFU {t['mfu']:.1%} of the datasheet peak" if t["mfu"] is not None else ""
                    # A sample of the MLP is one row, not a sequence: its tokens/s would repeat samples/s.
                    tokens = f"{t['tokens_per_s']:.0f} tokens/s, " if self.workload.tokens_per_sample > 1 else ""
                    line += f"; {tokens}{flops_text(t['tflops_per_gpu'], self.device.type)}{mfu}"
                    if self.predicted is not None:
                        measured, peak = statistics.median(times), max(peaks)
                        line += "; " + compare_text(measured, self.predicted.step_s, peak, self.predicted.peak / 2**30)
                        progress.record({"summary": {
                            "step_time_s": round(measured, 6), "predicted_step_time_s": round(self.predicted.step_s, 6),
                            "peak_mem_gib": peak, "predicted_peak_mem_gib": round(self.predicted.peak / 2**30, 3),
                            "plan": self.predicted.plan.flags()}})
                progress.say(line)
            if cfg.reporting.trace and steps > first_step:
                self._write_trace(progress)
            if cfg.reporting.metrics or cfg.reporting.trace:
                self._stop_if_a_report_failed([x[0] for x in gather_per_rank([_failure_code(progress)], self.device)])
        finally:
            progress.close()

    def _learn_plan(self, step: int, times: list[float], progress: Progress) -> bool:
        """The cost model refitted to this run's measured steps (collective); the plan switched once, in place,
        when another of the same stages is predicted more than 5% faster. Said and recorded by rank 0."""
        self.cfg, refit, line = learn_plan.refit_and_switch(self.replanner, self.cfg, self.engine, times, step)
        self.replanner = None  # once
        self.predicted = refit.best_in_place if refit.switch else refit.current
        progress.say(line)
        # "refit" first: a record's first key names its kind (metrics/records.py)
        progress.record({"refit": {
            "compute_scale": refit.card.compute_scale, "host_action_s": refit.card.host_action_s,
            "allreduce_bytes_s": refit.card.allreduce_bytes_s,
            "measured_step_time_s": refit.measured_s, "predicted_step_time_s": refit.current.step_s,
            "switched_to": refit.best_in_place.plan.flags() if refit.switch else None}, "step": step})
        return refit.switch

    def _throughput(self, step_time_s: float) -> dict:
        """tokens/s, model TFLOP/s per GPU and MFU (model FLOPs over the card's datasheet dense peak; None for a
        card not in hybrid_engine/metrics/flops.py's table, e.g. the CPU)."""
        w, world = self.workload, self.grid.world_size
        tokens_per_s = self.cfg.data.batch_size * w.tokens_per_sample / step_time_s
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else ""
        dtype = self.engine.precision.half_dtype or torch.float32
        return {"tokens_per_s": round(tokens_per_s, 1),
                # significant digits, not decimals: a small model on a CPU runs at a few GFLOP/s
                "tflops_per_gpu": float(f"{tokens_per_s * w.flops_per_token / world / 1e12:.4g}"),
                "mfu": flops.mfu(tokens_per_s / world, w.flops_per_token, name, dtype)}

    def _maybe_validate(self, done: int, progress: Progress, max_batches: int = 16) -> None:
        """GPT: the mean loss over (up to `max_batches` of) the held-out data, every eval_every steps and after the
        last; collective over the world. With the built-in corpus, beside the source's entropy rate (the floor)."""
        every, steps = self.cfg.training.eval_every, self.cfg.training.steps
        if not every or not (done % every == 0 or done == steps):
            return
        data, engine, m = self.workload.data, self.engine, self.cfg.schedule.micro_batches
        batch, start = self.cfg.data.batch_size, self.groups.coords.dp * self.per_dp
        losses = []
        for i in range(min(max_batches, data.val_batches(batch))):
            x, y = data.val_batch(i, batch, start, start + self.per_dp, device=self.device, chunks=self.chunks)
            losses.append(engine.evaluate(x if engine.holds_first_stage else None,
                                          y if engine.holds_last_stage else None, micro_batches=m))
        val = sum(losses) / len(losses)
        source = getattr(data, "source", None)
        floor = source.entropy_rate_nats() if source is not None else None
        progress.say(f"step {done - 1}: validation loss {val:.4f}"
                     + (f" (the corpus's entropy rate, the floor: {floor:.4f})" if floor is not None else ""))
        # "val_loss" first: a record's first key names its kind (metrics/records.py)
        progress.record({"val_loss": val, "entropy_floor": floor, "step": done - 1})

    def _first_step(self, step: int):
        """The run's first step. Out of memory there under the planner's plan, every rank learns which ranks ran
        out (one small all-gather) and raises FirstStepOutOfMemory, outside the handler, so that nothing of the
        failed step is kept alive by its traceback: the driver releases the engine and takes another plan."""
        failed = False
        try:
            result = self._step(step)
        except torch.OutOfMemoryError:
            if not self.fallback:
                raise
            failed, result = True, None
        if self.fallback:
            ranks = [r for r, (out,) in enumerate(gather_per_rank([float(failed)], self.device)) if out]
            if ranks:
                raise FirstStepOutOfMemory(ranks)
        return result

    def _step(self, step: int):
        """One optimizer step: this DP rank's rows of step `step`, only what this rank consumes."""
        cfg, engine = self.cfg, self.engine
        if self.faults.runs_out_of_memory(step):
            raise torch.OutOfMemoryError(f"injected out of memory at step {step} (HYBRID_ENGINE_TEST_OOM_AT_STEP)")
        if self.faults.kills(step, self.rank):
            faults.kill_self()
        if self.faults.freezes(step, self.rank):
            faults.freeze_self()
        # Inputs on the first stage, targets on the last (drawn block by block: no full-size inputs kept for
        # them), straight in the dtype the engine takes (half weights take half data), so no full-size fp32 copy
        # ever exists. Data, not the engine, would otherwise set the largest batch (experiments/bench/max_batch.py).
        poison = self.faults.poisons(step)
        first_row = self.groups.coords.dp * self.per_dp
        if cfg.data.stream:
            x, y = micro_batch_sources(self.workload, step, first_row, self.per_dp // cfg.schedule.micro_batches,
                                       engine, self.data_dtype, self.device, poison)
        elif engine.holds_first_stage or engine.holds_last_stage:  # a middle stage draws nothing
            x, y = self.workload.draw(step, first_row, first_row + self.per_dp, inputs=engine.holds_first_stage,
                                      targets=engine.holds_last_stage, dtype=self.data_dtype, device=self.device,
                                      chunks=self.chunks)
            if poison and x is not None and x.is_floating_point():
                x.fill_(float("nan"))  # this step's own tensor: no copy
        else:
            x = y = None
        result = engine.train_step(x, y)
        x = y = None  # the step's data dies here, before anything else (a checkpoint, the next step's draw)
        return result

    def _judge(self, step: int, loss: float, guard: DivergenceGuard, ckpts: RunCheckpoints,
               probe: bool = False) -> None:
        """Stop every rank (the loss is all-reduced: all judge alike) when `loss` is not finite or a spike; the
        checkpoint written for this step's state is then never published."""
        problem = guard.problem(step, loss)
        if problem is None:
            guard.accept(loss)
            return
        ckpts.discard_written()
        where = " (the forward pass that checks the last checkpoint)" if probe else ""
        spike = " (--spike-factor 0 trains through spikes)" if problem.endswith("a spike") else ""
        raise TrainingStopped(f"{problem}{where}: training stopped (an update diverged); "
                              f"{ckpts.where_to_continue()}{spike}")

    def _probe(self, step: int) -> float:
        """The loss of the current state on step `step`'s batch, forward only (collective): what the step after
        the last would see, so that the last checkpoint is checked like every other."""
        first_row = self.groups.coords.dp * self.per_dp
        engine = self.engine
        x, y = (self.workload.draw(step, first_row, first_row + self.per_dp, inputs=engine.holds_first_stage,
                                   targets=engine.holds_last_stage, dtype=self.data_dtype, device=self.device,
                                   chunks=self.chunks)
                if engine.holds_first_stage or engine.holds_last_stage else (None, None))
        return engine.evaluate(x, y, micro_batches=self.cfg.schedule.micro_batches)

    def _stop_if_a_report_failed(self, codes: list[float]) -> None:
        """Every rank raises the same ReportingError when rank 0 could not write a report (codes: gathered
        _failure_code of every rank)."""
        code = int(max(codes))
        if code:
            err, trace = divmod(code, 2)
            what = f"--trace {self.cfg.reporting.trace}" if trace else f"--metrics {self.cfg.reporting.metrics}"
            raise ReportingError(f"cannot write {what}: {os.strerror(err)}")

    def _write_trace(self, progress: Progress) -> None:
        """Gather the last step's timed actions, DP and MP collectives and CP transfers of one pipeline onto rank 0
        (collective), which writes them."""
        cfg, c = self.cfg, self.groups.coords
        comm = self.engine.comm_trace
        first = c.dp == 0 and c.cp == 0 and c.mp == 0
        gathered = gather_pipeline_rows(spans_of(self.engine.trace), c.pp, self.grid.pp_size, first,
                                        *(comm_spans_of(comm, axis) for axis in ("dp", "mp", "cp")))
        if self.rank == 0:
            rows, comm_rows, mp_rows, cp_rows = gathered
            s, path = cfg.schedule, cfg.reporting.trace
            try:
                summary = write_trace(path, rows, s.name, s.micro_batches, s.virtual_stages, s.lookahead, comm_rows,
                                      mp_rows, cp_rows)
            except OSError as exc:  # the directory was checked before the first step; the disk may fill since
                raise ReportingError(f"cannot write --trace {path}: {exc.strerror or exc}") from None
            beside = "; ".join(f"{axis} collectives beside them: " + ", ".join(f"{n} {kind}" for kind, n in
                                                                             summary[key].items())
                               for axis, key in (("DP", "dp_collectives"), ("MP", "mp_collectives"),
                                                 ("CP", "cp_transfers")) if key in summary)
            progress.say(f"trace: {path}.json, measured bubble {summary['measured_bubble']:.3f}, "
                         f"simulated {summary['simulated_bubble']:.3f} (unit costs), "
                         f"{summary['calibrated_bubble']:.3f} (this run's per-stage action times)"
                         + (f"; {beside}" if beside else ""))
            progress.record({"trace": summary})
