"""Engine: wiring of grid groups, stage programs, schedule, executor, gradient buffer, optimizer and scaler.

One `train_step` is one optimizer step over this DP rank's slice of the global batch, cut into micro-batches that
the C++ executor pushes through this rank's pipeline stages in schedule order:

    train_step -> _forward_backward -> PipelineExecutor.run (stage programs, GradBuffer, DP sync)
               -> _update (loss scaler check, clipping, update strategy) -> _global_loss
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

import hybrid_engine._C as _C
from hybrid_engine.models import losses
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.data_parallel import param_gather, param_shards
from hybrid_engine.optim.scaling import OverflowWatch, make_loss_scaler
from hybrid_engine.config.engine import DataParallelConfig, PrecisionConfig, ScheduleConfig, StageConfig
from hybrid_engine.checkpoint.engine_state import EngineState
from hybrid_engine.parallel.data_parallel.grad_buffer import attach, build_grad_buffer
from hybrid_engine.fp8.linear import attach_weight_cache
from hybrid_engine.parallel.grid import ACTIVATION, GridGroups
from .global_loss import global_mean_loss
from .micro_batches import MicroBatches, micro_batch_fn
from .reschedule import Reschedule
from .step_result import StepResult
from hybrid_engine.models import materialize
from hybrid_engine.parallel.pipeline.partition import stages_of_rank
from hybrid_engine.optim.masters import MasterWeights
from hybrid_engine.parallel.pipeline.schedule import make_schedule
from .stage_specs import probe_stage_specs
from .update import UpdateStep
from hybrid_engine.parallel.pipeline.graphs import GraphChoice
from hybrid_engine.parallel.pipeline.stages import build_programs, plan_stages
from hybrid_engine.parallel.pipeline.units import stage_units
from hybrid_engine.parallel.data_parallel.tied import TiedGradients
from hybrid_engine.parallel.context.apply import apply_context_parallel, context_of
from hybrid_engine.planner.card import this_device
from hybrid_engine.planner.context_comm import comm_rule
from hybrid_engine.parallel.tensor.layers import parallelize_mlp
from hybrid_engine.optim.zero import ShardedOptimizer
from hybrid_engine.parallel.data_parallel.shard_groups import build_shard_groups

# How a model's stage is split over the MP group (torchtitan's one function per model): stage, mp group -> stage.
Parallelize = Callable[[nn.Sequential, dist.ProcessGroup], nn.Sequential]


class Engine(EngineState, UpdateStep, Reschedule):
    """Hybrid DP x CP x PP x MP training of an nn.Sequential (cp: the grid's; its attention by `cp_comm`,
    ring | all-gather | auto, hybrid_engine/parallel/context, auto decided on `plan_card`'s rates,
    hybrid_engine/planner/context_comm.py, its blocks by `cp_kernel`, auto | cudnn | flash,
    parallel/context/block_attention.py; the sequences given are this cp rank's chunks).

    model: the whole model (any device, or meta: see `materialize`); this rank keeps only its stages, with their
        nn.Linear layers split Megatron-style over the MP group (column then row parallel; with mp=1 they become
        hybrid_engine's deferrable Linear, which zb1 needs to split I from W).
    loss: `losses.MSE()` (built in, fused with a native last stage), `losses.VocabParallelCrossEntropy(V)` (a
        GPT's logits shard), or any callable (output, target) -> scalar mean loss of one micro-batch.
    groups: this rank's process groups (hybrid_engine.parallel.grid.build_groups).
    parallelize: the model's tensor-parallel transformation of one materialized stage, (stage, mp group) ->
        stage (`tp_layers.parallelize_mlp`, the default, or e.g. a GPT's `parallelize_gpt` with its options).
    layout: the module indices of every stage (pp x virtual stages lists, contiguous, covering the model), e.g.
        `balance.balanced_partition(costs, n)`, where a block may be named by its two halves on two stages
        (`units.Half`, e.g. `units.place`); None cuts by layer count (`partition.partition`).
        Parameters tagged `param.tied` (a tied embedding) get their gradients summed between the first and
        the last stage before every update (hybrid_engine/parallel/data_parallel/tied.py).
    optimizer: a factory params -> torch.optim.Optimizer (`optim.SGD(lr)`, `optim.AdamW(...)`, or any callable).
    schedule, stages, precision, data_parallel: typed configuration (hybrid_engine/config/engine.py).
    trace: time every action of each step (`trace` property) and its DP and MP collectives (`comm_trace`).
    cuda_graphs: the run's resolved --cuda-graphs (the driver's, which asks the planner); None resolves
        `stages.cuda_graphs` here (hybrid_engine/parallel/pipeline/graphs.py).
    """

    def __init__(self, model: nn.Sequential, loss: losses.LossSpec, groups: GridGroups, *,
                 optimizer: optim.OptimizerFactory = optim.SGD(),
                 schedule: ScheduleConfig = ScheduleConfig(), stages: StageConfig = StageConfig(),
                 precision: PrecisionConfig = PrecisionConfig(),
                 data_parallel: DataParallelConfig = DataParallelConfig(),
                 device: torch.device | str = "cpu", trace: bool = False,
                 parallelize: Parallelize = parallelize_mlp, layout: list[list[int]] | None = None,
                 cp_comm: str = "auto", plan_card: str = "auto", cuda_graphs: GraphChoice | None = None,
                 cp_kernel: str = "auto"):
        for cfg in (stages, precision):
            cfg.validate()
        data_parallel.validate(groups.grid)
        schedule.validate(groups.grid.pp_size)
        self.groups, self.grid, self.device = groups, groups.grid, torch.device(device)
        self.loss, self.schedule, self.stage_cfg = loss, schedule, stages
        self.precision, self.data_parallel, self._trace = precision, data_parallel, trace
        self.micro_batches = schedule.micro_batches
        self.pp_rank, self.pp_size, self.dp_size = groups.coords.pp, self.grid.pp_size, self.grid.dp_size
        self.replicas = self.dp_size * self.grid.cp_size  # the weights' copies: gradients summed over dp x cp
        # --trace: the DP, MP and CP collectives' launches and completions, beside the executor's compute spans.
        self._comm_trace = _C.CommTrace(str(self.device)) if trace else None
        # None without context parallelism; its ring or all-gather the planner's rule on the plan card's rates
        rule = comm_rule(cp_comm, this_device(plan_card, self.device.type)) if groups.cp is not None else None
        self.context = context_of(groups, rule, self._comm_trace, cp_kernel)
        self.num_stages, self.placement = self.pp_size * schedule.virtual_stages, schedule.placement

        # Stages: partition the whole model, plan every stage's program, build only this rank's chunks. A layout
        # that cuts inside blocks (units.Half) is a layout of the model's units: those blocks' halves in their place.
        model, layout, module_index = stage_units(model, layout, self.num_stages)
        self.layout = layout
        self.plans = plan_stages(model, layout, self.grid.mp_size, precision, stages,
                                 tp_chains=parallelize is parallelize_mlp)
        self.stage_ids = stages_of_rank(self.pp_rank, self.pp_size, schedule.virtual_stages, self.placement)
        # each unit's module index: what a checkpoint's names start with
        self.stage_layer_indices = {s: [module_index[u] for u in layout[s]] for s in self.stage_ids}
        self._stages: dict[int, nn.Sequential] = {}
        # Parallelized while still on the meta device, then built layer by layer in the weights' dtype: a rank
        # allocates only its slices, and the model's own (meta) layers never take memory.
        half = precision.half_dtype if precision.half_weights else None
        for s in self.stage_ids:
            stage = materialize(parallelize(nn.Sequential(*[model[i] for i in layout[s]]), groups.mp), self.device,
                                half)
            stage = apply_context_parallel(stage, self.context)
            self._stages[s] = stage
        self._parameters = [p for s in self.stage_ids for p in self._stages[s].parameters()]
        # The tensors the optimizer steps: the parameters themselves, or (half weights) their fp32 masters; under
        # ZeRO flat shards that the sharded optimizer owns (it reads the gradient buckets directly).
        sharded = data_parallel.zero >= 1
        # ZeRO-2/3 without a pipeline reduce-scatter each micro-batch's gradients into the shards (a bucket exists
        # from its first write to its reduction); a pipeline stage's interleaved micro-batches reduce once a step.
        per_micro = data_parallel.zero >= 2 and self.pp_size == 1
        # Who shares one sharded copy (every rank creates every group, so before anything else collective).
        self._shard_groups = (build_shard_groups(groups, data_parallel.shard_size, precision.max_grad_norm > 0)
                              if sharded else None)
        self.masters = MasterWeights(self._parameters) if precision.half_weights and not sharded else None
        self.optimized = self.masters.masters if self.masters else self._parameters
        stepped = {id(p): None if sharded and (precision.half_weights or per_micro) else o
                   for p, o in zip(self._parameters, self.optimized)}
        # Tied copies (first and last stage): their groups are created here, by every rank, in the same order.
        # Under ZeRO each copy gets a bucket of its own, so the copies' DP shards line up (data_parallel/tied.py).
        self._tied = TiedGradients(model, layout, groups, self._stages, self.placement)
        self.buffer_layout = build_grad_buffer(self._stages, stepped, precision.half_weights,
                                               int(data_parallel.bucket_mb * 2**20), self.device,
                                               pad_to=self._shard_groups.size if sharded else 1,
                                               alone=self._tied.param_ids if sharded else frozenset(),
                                               route_all=per_micro)
        self.grads, self._stage_buckets = self.buffer_layout.grads, self.buffer_layout.stage_buckets
        self.grads.set_restore_on_write(per_micro)
        attach(self._stages, self.grads, self._comm_trace)
        self.fp8_weights = attach_weight_cache(self._stages.values())  # emptied where the weights may change
        self._comm_spans: list = []
        self.zero = (ShardedOptimizer(optimizer, self.buffer_layout, precision.half_weights, groups,
                                      self._shard_groups, data_parallel.zero, self.device, self._stages,
                                      data_parallel.overlap_param_gather, self._comm_trace, self._tied.not_counted,
                                      data_parallel.prefetch, {p.stage for p in self.plans if p.native},
                                      {s for s in self.stage_ids if self.pp_size == 1 and not self.plans[s].native
                                       and not stages.compile}, per_micro)
                     if sharded else None)
        # ZeRO-1 with the parameter all-gather overlapped: each layer of the forward waits for its own bucket.
        waits = self.zero.waits if self.zero is not None and self.zero.overlap else None
        self._eager_programs = build_programs(self.plans, self._stages, precision, stages, self.device, self.grads,
                                              waits, groups.mp, self._comm_trace)
        # --cuda-graphs on where the run cannot have graphs: ConfigError
        self.cuda_graphs = cuda_graphs or self.graph_choice(schedule, stages.cuda_graphs)
        self._programs = self.graphed_programs(self.cuda_graphs)
        self.actions = make_schedule(schedule.name, self.pp_size, schedule.micro_batches, schedule.virtual_stages,
                                     schedule.lookahead)[self.pp_rank]
        if self.zero is not None:
            self._tied.bind(self.zero.grad_shard_of, sharded=True)
        else:
            optimized_of = dict(zip(map(id, self._parameters), self.optimized))
            self._tied.bind(lambda p: optimized_of[id(p)].grad)
        self.optimizer, self.update = ((self.zero.optimizer, self.zero) if self.zero is not None
                                       else optim.make_update(optimizer, self.optimized, self.masters, self.device))
        self.optimizer_name = optim.describe(optimizer)
        self.scaler = make_loss_scaler(precision.amp, precision.loss_scale, precision.scale_window,
                                       precision.hysteresis)
        self.overflow_watch = OverflowWatch(rank=groups.rank)
        self._overwrite_grads = self.overwrites_grads(schedule)
        self._post_backward_hooks: list[Callable[["Engine"], None]] = []
        self._executor: _C.PipelineExecutor | None = None  # built on the first step, once shapes are known
        self._dp_sync: _C.DpGradSync | None = None  # the executor's
        if groups.rank == 0:
            self._announce()

    def _announce(self) -> None:
        """The choices made for the user, once, by rank 0: every stage's program, the loss, the update."""
        lines = [plan.describe(self.stage_cfg) for plan in self.plans]
        lines.append(f"loss: {losses.describe(self.loss, self.plans[-1].native)}")
        lines.append(self.cuda_graphs.describe())
        if self._tied:
            lines.append(self._tied.describe())
        lines.append(self.update.describe())
        if self.precision.max_grad_norm > 0:
            lines.append(f"gradient clipping: global norm {self.precision.max_grad_norm:g} (MP-replicated and tied "
                         "parameters counted once)")
        if self.zero is not None and self.zero.level == 3:
            lines.append(param_shards.describe(self.data_parallel.prefetch, self.pp_size,
                                               [p.stage for p in self.plans if p.native and p.stage in self.stage_ids],
                                               self.zero.resharded))
        elif self.zero is not None:
            autograd = [p.stage for p in self.plans if not p.native]
            lines.append(param_gather.describe(self.zero.overlap, self.dp_size,
                                               [p.stage for p in self.plans if p.native],
                                               [] if self.stage_cfg.compile else autograd,
                                               autograd if self.stage_cfg.compile else []))
        print("\n".join(lines), flush=True)

    # ----------------------------------------------------------------------------------------------- setup
    def stage_specs(self, micro_input: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every stage's input and output shape and dtype (meta tensors); all ranks of the pipeline join."""
        return probe_stage_specs(self._stages, self.groups, self.num_stages, self.placement, self.precision,
                                 self.device, micro_input)

    def _build_executor(self, micro_input: torch.Tensor | None) -> _C.PipelineExecutor:
        inputs, outputs = self.stage_specs(micro_input)
        sends, recvs = {}, {}
        for (src, dst, kind), channel in self.groups.channels.items():
            code = 0 if kind == ACTIVATION else 1
            entry = (channel.group, channel.peer_group_rank)
            if src == self.pp_rank:
                sends[(dst, code)] = entry
            if dst == self.pp_rank:
                recvs[(src, code)] = entry
        # Gradients sum over DP x CP (the dp group while cp = 1); sharded, over one copy's ranks and then across
        # the copies (hybrid sharding, parallel/data_parallel/shard_groups.py).
        shards = self._shard_groups
        group = shards.shard if shards is not None and shards.shard is not None else self.groups.dp_cp
        self._dp_sync = dp_sync = _C.DpGradSync(
            list(self.grads.buckets), group, self.data_parallel.wire_dtype, shard=self.zero is not None,
            trace=self._comm_trace, keep_shards=self.zero.keep_shards() if self.zero is not None else [],
            replica_group=shards.replicas if shards is not None else None,
            every_micro=self.zero is not None and self.zero.reduce_every_micro)
        builtin = losses.is_builtin(self.loss)
        return _C.PipelineExecutor(
            actions=self.actions, pp_rank=self.pp_rank, pp_size=self.pp_size, num_stages=self.num_stages,
            num_micro=self.micro_batches, programs=self._programs, builtin_mse=builtin,
            loss_fn=None if builtin else losses.bind(self.loss, self.groups, self._stages.get(self.num_stages - 1)),
            send_channels=sends, recv_channels=recvs,
            input_specs=inputs, output_specs=outputs, device=str(self.device), grads=self.grads, dp_sync=dp_sync,
            stage_buckets=self._stage_buckets, merge_weight_grads=self.schedule.merge_weight_grads,
            record_trace=self._trace, overwrite_weight_grads=self._overwrite_grads, comm_trace=self._comm_trace,
            placement=self.placement)

    # ----------------------------------------------------------------------------------------- the step
    @property
    def holds_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def zero_grad(self) -> None:
        if self._dp_sync is not None and self._dp_sync.keeps_shards:
            self._dp_sync.restore()  # ZeRO-2/3: the buckets released after their reduce-scatter, back and zeroed
            return
        for flat in self.grads.buckets:
            flat.zero_()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next steps, in every param group (an lr schedule calls this before a step)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def add_post_backward_hook(self, hook: Callable[["Engine"], None]) -> None:
        """Call hook(engine) in every step once the gradients are summed over DP, before the optimizer's side of
        the step (it may read or change `engine.grads.buckets`, e.g. to inspect or perturb gradients; under ZeRO-2
        and 3 the buckets are released by then and the summed shards are `engine.zero.grad_shards`)."""
        self._post_backward_hooks.append(hook)

    def train_step(self, inputs: MicroBatches, targets: MicroBatches) -> StepResult:
        """inputs/targets: this DP rank's slice of the global batch (inputs needed on the first stage, targets on
        the last; pass None elsewhere). Either may instead be a callable micro -> that micro-batch's rows of the
        slice: the executor then asks for each micro-batch when its forward runs, so the batch is never resident
        as a whole. Returns the global mean loss on every rank."""
        start = time.perf_counter()
        self.fp8_weights.clear()  # the last update (and ZeRO-1's gathers landing) changed the weights
        scale = self.scaler.scale if self.scaler is not None else 1.0
        # The loss of each micro-batch is divided by the micro-batch count and dp x cp here, exactly once (and
        # multiplied by the fp16 loss scale): the DP all-reduce then sums to the mean with no extra pass over the
        # gradients. The executor returns the losses before this multiplier.
        if self.zero is not None:
            self.zero.begin_step()  # ZeRO-3: the first buckets' parameter gathers
        micro_losses = self._forward_backward(inputs, targets, scale / (self.micro_batches * self.replicas))
        if self.zero is not None:
            self.zero.end_backward()  # ZeRO-3: the parameter buffers released
        if self._comm_trace is not None:  # this step's gradient collectives and the gathers its forward waited for
            self._comm_spans = self._comm_trace.take()
        for hook in self._post_backward_hooks:
            hook(self)
        found_inf, skipped, grad_norm = self._update()
        loss = self._global_loss(micro_losses)
        if self.device.type == "cuda":
            # The compute stream, not the device: ZeRO-1's parameter all-gathers (on the DP group's stream) stay in
            # flight into the next forward, which waits for each where it reads it.
            torch.cuda.current_stream(self.device).synchronize()
        if found_inf is not None:
            skipped = bool(found_inf.item())  # behind the syncs above: no extra wait
        if self.scaler is not None:
            self.scaler.update(skipped)
            self.overflow_watch.observe(self.scaler)
        return StepResult(loss=loss, step_time_s=time.perf_counter() - start, skipped=bool(skipped),
                          loss_scale=scale if self.scaler is not None else None, grad_norm=grad_norm)

    def evaluate(self, inputs: torch.Tensor | None, targets: torch.Tensor | None, micro_batches: int = 1) -> float:
        """Forward-only mean loss (no gradients, no state change): hybrid_engine.engine.evaluate.evaluate."""
        from hybrid_engine.engine.evaluate import evaluate
        self.wait_for_parameters()
        return evaluate(self, inputs, targets, micro_batches)

    def _forward_backward(self, inputs: MicroBatches, targets: MicroBatches, multiplier: float) -> list:
        """Runs the step's pipeline program (building the executor on the first step); the gradients are then
        summed over DP. Returns the per-micro-batch losses on the last stage."""
        for needed, given, what in ((self.holds_first_stage, inputs, "inputs"),
                                    (self.holds_last_stage, targets, "targets")):
            if needed and given is None:
                raise ValueError(f"pipeline rank {self.pp_rank} holds the {'first' if what == 'inputs' else 'last'} "
                                 f"stage: train_step needs its {what}")
        half = self.precision.half_dtype if self.precision.half_weights else None
        if callable(inputs) or callable(targets):
            input_fn = micro_batch_fn(inputs, self.micro_batches, half, "inputs") if self.holds_first_stage else None
            target_fn = (micro_batch_fn(targets, self.micro_batches, None, "targets") if self.holds_last_stage
                         else None)
            self._prepare(input_fn(0) if input_fn and self._executor is None else None)
            return self._executor.run_streamed(input_fn, target_fn, multiplier)
        if self.holds_first_stage and half is not None and inputs.is_floating_point():
            inputs = inputs.to(half)
        micro_in = list(inputs.chunk(self.micro_batches)) if self.holds_first_stage else []
        micro_tgt = list(targets.chunk(self.micro_batches)) if self.holds_last_stage else []
        self._prepare(micro_in[0] if micro_in else None)
        return self._executor.run(micro_in, micro_tgt, multiplier)

    def _prepare(self, first_micro_input: torch.Tensor | None) -> None:
        """The executor (first step: its shapes come from a micro-batch), and zeroed gradients unless this step
        overwrites them."""
        if self._executor is None:
            self._executor = self._build_executor(first_micro_input)
        if self._dp_sync.keeps_shards or not self._executor.overwrites_weight_grads:
            self.zero_grad()

    def _global_loss(self, micro_losses: list[torch.Tensor]) -> float:
        """Mean loss over the global batch, on every rank (engine/global_loss.py)."""
        return global_mean_loss(micro_losses, self.holds_last_stage and self.groups.coords.mp == 0, self.replicas,
                                self.device)

    def close(self) -> None:
        """Drop the executor (it holds process groups and buffers) and free the stages' CUDA graphs; the engine
        cannot step afterwards. Nothing of it is process-wide, so other engines in the process are untouched."""
        self.wait_for_parameters()  # no all-gather left writing into the parameters
        self.drop_graphs()
        self._tied.close()
        if self._shard_groups is not None:
            self._shard_groups.close()

    @property
    def stage_programs(self) -> dict:
        """{stage: _C.StageProgram} of this rank (`.native`, `.describe()`)."""
        return dict(self._programs)

    def activity(self) -> dict | None:
        """What the pipeline executor is doing now, or was doing when its step threw (_C.PipelineExecutor.activity;
        safe from any thread); None before the first step."""
        executor = self._executor
        return executor.activity() if executor is not None else None

    @property
    def trace(self) -> list:
        return list(self._executor.trace()) if self._executor is not None else []

    @property
    def comm_trace(self) -> list:
        """The last step's collectives (_C.CommSpan: axis, kind, bucket, start_us, end_us on the `trace` clock): DP's
        gradient buckets' reduce-scatters or all-reduces, and the parameter all-gathers the step waited for (ZeRO-1/2:
        launched by the previous step's update, so they start before 0; ZeRO-3: ahead of the layers reading each
        bucket); MP's all-reduces and all-gathers of tensor-parallel chains (`bucket`: the chain layer)."""
        return list(self._comm_spans)

    def wait_for_parameters(self) -> None:
        """ZeRO-1 with the all-gather overlapped: finish every parameter gather still in flight, so the whole
        updated model is in place (the next forward waits layer by layer instead). Whoever asks may read or write the
        weights next, so fp8's cached weight forms go."""
        self.fp8_weights.clear()
        if self.zero is not None:
            self.zero.wait_for_parameters()

    @property
    def stages(self) -> dict[int, nn.Sequential]:
        """This rank's stage modules {stage: nn.Sequential}, their parameters complete (waits for the gathers)."""
        self.wait_for_parameters()
        return self._stages

    @property
    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters in stage order, complete (waits for ZeRO-1's gathers, like `stages`)."""
        self.wait_for_parameters()
        return self._parameters
