"""The engine's typed configuration: one frozen dataclass per concern, each field documented, validated once.

These are what `Engine` takes. The run-level configuration (grid, model, data, training loop, checkpoints,
reporting) and the command line and TOML mapping live in hybrid_engine/config/run.py; schedule names and rules come
from the C++ core (csrc/schedule/generators.h), never from a second list here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

import hybrid_engine._C as _C

from .fields import flag

SCHEDULES: tuple[str, ...] = tuple(_C.schedule.schedule_names())
STAGE_IMPLS = ("auto", "native", "autograd")
RECOMPUTE = ("none", "selective", "full")
AMP_MODES = ("off", "fp16", "bf16")
GRAPH_MODES = ("auto", "on", "off")
SPLIT_MODES = ("auto", "on", "off")
AMP_IMPLS = ("half-weights", "autocast")
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DP_GRAD_DTYPES = {"fp32": None, "bf16": torch.bfloat16}
MAX_BUCKET_MB = 1 << 20


class ConfigError(ValueError):
    """A user mistake in the run's configuration; its message is the one line the user sees."""


def _choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


AUTO = "auto"


@dataclass(frozen=True)
class ScheduleConfig:
    """How micro-batches flow through the pipeline (csrc/schedule). A run leaves every field to the planner
    (`ScheduleConfig.planned()`: auto, hybrid_engine/planner fills what no flag gives); an Engine takes concrete
    values, and the class's own defaults are the reference plan, 1f1b with 4 micro-batches."""

    name: str = field(default="1f1b", metadata=flag("--schedule", choices=(AUTO, *SCHEDULES)))
    """auto (the planner picks the fastest plan that fits memory) | naive | gpipe | 1f1b | interleaved | zb1
    (zero-bubble: weight gradients deferred into the bubbles) | dualpipev | zbv (two chunks per rank in a V,
    --virtual-stages 2: DeepSeek's DualPipe folded, and ZB-V)."""
    micro_batches: int | None = field(default=4, metadata=flag(metavar="M", words={AUTO: None}))
    """Micro-batches per DP rank per step (auto: the planner's); the step's loss is their mean."""
    virtual_stages: int | None = field(default=1, metadata=flag(metavar="V", words={AUTO: None}))
    """Model chunks per pipeline rank (interleaved; zbv and dualpipev run exactly 2; auto: the planner's)."""
    lookahead: int | None = field(default=0, metadata=flag(metavar="K", words={AUTO: None}))
    """1f1b/zb1: forwards every rank but the last runs beyond the 1F1B warm-up, hiding the gradient's round trip
    at the cost of one more micro-batch of activations each (auto: the planner's)."""
    merge_weight_grads: bool | None = field(default=False, metadata=flag("--merge-wgrad"))
    """zb1, zbv: compute a stage's weight gradients once over all micro-batches (one GEMM per layer); unset: the
    planner's."""

    @staticmethod
    def planned() -> "ScheduleConfig":
        """Every field left to the planner: a run's default."""
        return ScheduleConfig(AUTO, None, None, None, None)

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank; 1 while the planner has not chosen (the fewest stages a plan has)."""
        return self.virtual_stages or 1

    @property
    def placement(self) -> str:
        """Which pipeline rank runs which stage: the named schedule's ('loop' | 'v', csrc/schedule/placement.h)."""
        return _C.schedule.schedule_placement(self.name)

    @property
    def unset(self) -> tuple[str, ...]:
        """The fields left to the planner."""
        return tuple(name for name, value in (("name", self.name), ("micro_batches", self.micro_batches),
                                               ("virtual_stages", self.virtual_stages),
                                               ("lookahead", self.lookahead),
                                               ("merge_weight_grads", self.merge_weight_grads))
                     if value is None or value == AUTO)

    def validate(self, pp: int) -> None:
        """The C++ core's rules for this request (one line each), and the flags that only some schedules use."""
        if self.unset:
            self.check_merge()
            raise ConfigError(f"schedule: {', '.join(self.unset)} left to auto: the driver's planner fills them "
                              "(an Engine takes a concrete schedule)")
        self.check_rules(pp)

    def check_rules(self, pp: int) -> None:
        """The C++ core's rules for what this request fixes (csrc/schedule/generators.h check_schedule_request),
        never restated here; its line names the flag at fault. A schedule left to the planner is checked once the
        planner has named one; a count left to it is asked at a value the schedule takes (micro-batches and
        virtual stages: the schedule's least, lookahead: 0), so only what the user fixed can be refused."""
        self.check_merge()
        try:
            if self.name == AUTO:  # only the rule that holds for any schedule
                if self.micro_batches is not None and self.lookahead:
                    _C.schedule.check_lookahead(self.micro_batches, self.lookahead)
                return
            micro = (_C.schedule.least_micro_batches(self.name, pp) if self.micro_batches is None
                     else self.micro_batches)
            chunks = (_C.schedule.least_virtual_stages(self.name) if self.virtual_stages is None
                      else self.virtual_stages)
            _C.schedule.check_schedule_request(self.name, pp, micro, chunks, self.lookahead or 0)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def check_merge(self) -> None:
        """--merge-wgrad only with a schedule that splits every backward (the C++ core's splits_backward: zb1, zbv),
        or one left to the planner, which then picks such a schedule."""
        if self.merge_weight_grads and self.name != AUTO and not _C.schedule.splits_backward(self.name):
            split = [name for name in SCHEDULES if _C.schedule.splits_backward(name)]
            raise ConfigError(f"merging weight gradients applies to the {' and '.join(split)} schedules only (got "
                              f"{self.name}): it merges the deferred W actions, which only they have for every "
                              "backward")


@dataclass(frozen=True)
class StageConfig:
    """How each pipeline stage computes (hybrid_engine/parallel/pipeline/stages.py)."""

    impl: str = field(default="auto", metadata=flag("--stage-impl", choices=STAGE_IMPLS))
    """auto: a plain Linear(+ReLU) chain runs natively in the C++ executor (no autograd), anything else through
    autograd; native: require the native chain for every stage; autograd: every stage through autograd."""
    recompute: str = field(default="none", metadata=flag(
        choices=RECOMPUTE, const="full", aliases={"--no-recompute": "none", "--selective-recompute": "selective"},
        bools={True: "full", False: "none"}))
    """Activation recomputation: none; full (keep only each stage's input between a micro-batch's forward and
    backward, rerun the forward in the backward); selective (the GPT and the Llama: recompute only the attention core, keep
    every other activation). --recompute alone is full."""
    compile: bool = False
    """Run autograd stages' modules under torch.compile (native stages are already fused)."""
    tp_chunks: int = field(default=0, metadata=flag(metavar="N"))
    """Native tensor-parallel chains: row chunks per micro-batch, so the MP all-reduce of one chunk runs under the
    GEMMs of the next (0: auto, which does not split: on 4 x H200 splitting cost more than it hid)."""
    cuda_graphs: str = field(default="auto", metadata=flag(choices=GRAPH_MODES))
    """Capture each stage's forward and backward as CUDA graphs and replay them, one launch instead of one per
    kernel (native chains: graphs per micro-batch; autograd stages: one slot per micro-batch in flight; auto: on
    CUDA where the run allows it and the planner predicts it faster and fitting, said once at start; on:
    required, or one line and exit 2; off: eager)."""
    split_blocks: str = field(default="auto", metadata=flag(choices=SPLIT_MODES))
    """Let a pipeline stage end inside a transformer block, between its attention and MLP halves (each takes and
    returns the residual stream), where whole blocks leave the pipeline ranks' work uneven: auto where that
    lowers the busiest rank's work by more than parallel/pipeline/units.py's AUTO_GAIN; on: cut over halves
    always; off: whole blocks."""

    def __post_init__(self):
        if isinstance(self.recompute, bool):  # StageConfig(impl, True): the engine's whole-stage recompute
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")

    @property
    def full_recompute(self) -> bool:
        """Whole stages recomputed (the engine's business; selective recompute is the model's)."""
        return self.recompute == "full"

    def validate(self) -> None:
        _choice(self.impl, STAGE_IMPLS, "stages.impl (--stage-impl)")
        _choice(self.recompute, RECOMPUTE, "stages.recompute (--recompute)")
        _choice(self.cuda_graphs, GRAPH_MODES, "stages.cuda_graphs (--cuda-graphs)")
        _choice(self.split_blocks, SPLIT_MODES, "stages.split_blocks (--split-blocks)")
        if self.tp_chunks < 0:
            raise ConfigError(f"stages.tp_chunks (--tp-chunks) must be >= 0 (0: auto), got {self.tp_chunks}")


@dataclass(frozen=True)
class PrecisionConfig:
    """Mixed precision and the loss scaler (hybrid_engine/optim/masters.py, csrc/amp)."""

    amp: str = field(default="off", metadata=flag(choices=AMP_MODES))
    """off | fp16 (with dynamic loss scaling) | bf16."""
    implementation: str = field(default="half-weights", metadata=flag("--amp-impl", choices=AMP_IMPLS))
    """half-weights: half weights for the whole step, fp32 masters and fp32 gradient accumulation;
    autocast: fp32 weights cast inside every matrix product by torch.autocast."""
    loss_scale: float | None = field(default=None, metadata=flag(metavar="SCALE"))
    """fp16: a static loss scale instead of the dynamic one."""
    scale_window: int = field(default=2000, metadata=flag(metavar="N"))
    """fp16: clean steps before the dynamic scale doubles."""
    hysteresis: int = field(default=1, metadata=flag(metavar="N"))
    """fp16: overflows tolerated before the dynamic scale halves."""
    clip_grad: float | None = field(default=None, metadata=flag(metavar="NORM"))
    """Clip the global gradient norm to this (0: off); MP-replicated parameters count once. none: 1.0 for the
    transformers (gpt, llama), off for the MLP; an Engine given none clips nothing."""

    def validate(self) -> None:
        _choice(self.amp, AMP_MODES, "precision.amp (--amp)")
        _choice(self.implementation, AMP_IMPLS, "precision.implementation (--amp-impl)")
        if self.loss_scale is not None and self.amp != "fp16":
            raise ConfigError(f"--loss-scale applies to --amp fp16 only, got --amp {self.amp}")

    @property
    def max_grad_norm(self) -> float:
        """The clipping norm (0: off; none, the model's default left unresolved, is off)."""
        return self.clip_grad or 0.0

    @property
    def half_dtype(self) -> torch.dtype | None:
        return HALF_DTYPES.get(self.amp)

    @property
    def autocast(self) -> bool:
        return self.amp != "off" and self.implementation == "autocast"

    @property
    def half_weights(self) -> bool:
        return self.amp != "off" and self.implementation == "half-weights"


@dataclass(frozen=True)
class DataParallelConfig:
    """How gradients are combined over DP replicas (csrc/grad, csrc/executor/dp_grad_sync.h)."""

    bucket_mb: float = field(default=256.0, metadata=flag("--dp-bucket-mb", metavar="MIB"))
    """Size cap (MiB of gradient) of a bucket; buckets hold whole layers, last layer first, and each starts its
    collective as soon as its gradients are final in the step's last backward."""
    grad_dtype: str = field(default="fp32", metadata=flag("--dp-grad-dtype", choices=tuple(DP_GRAD_DTYPES)))
    """fp32 | bf16: the dtype gradients travel in (bf16 halves the bytes on the link, rounding each replica's
    gradient and their sum to bf16; accumulation stays fp32)."""
    zero: int = field(default=0, metadata=flag(choices=(0, 1, 2, 3)))
    """0: every DP rank keeps the whole optimizer state (buckets all-reduced); 1: the distributed optimizer
    (ZeRO-1, hybrid_engine/optim/zero.py): buckets reduce-scattered, masters and optimizer state sharded over DP, the
    updated parameters all-gathered; 2: gradients sharded too (a bucket is released once reduce-scattered); 3:
    parameters sharded too (gathered bucket by bucket ahead of the layers that read them, released after them;
    with a pipeline, kept for the step: docs/performance.md "ZeRO levels")."""
    overlap_param_gather: bool = True
    """With zero 1: each bucket's parameter all-gather is launched as soon as its shard is updated and waited for
    only by the next forward's first layer that reads it (hybrid_engine/parallel/data_parallel/param_gather.py); false waits for all of
    them at the end of the step (exposed)."""
    shard_size: int = field(default=0, metadata=flag("--zero-shard-size", metavar="N"))
    """With zero >= 1: shard over groups of N data-parallel ranks and replicate across the groups (hybrid sharding:
    gradients reduce-scattered within a group, then all-reduced across the copies); 0: shard over all of them."""
    prefetch: int = field(default=1, metadata=flag("--zero-prefetch", metavar="K"))
    """With zero 3: how many parameter buckets' all-gathers run ahead of the layer computing (>= 1)."""

    def validate(self, grid=None) -> None:
        """grid (a ProcessGrid, when known): the shard size must divide its DP x CP ranks."""
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"data_parallel.zero (--zero) must be 0, 1, 2 or 3, got {self.zero}")
        if self.shard_size < 0 or self.shard_size == 1 or (self.shard_size and not self.zero):
            raise ConfigError(f"--zero-shard-size {self.shard_size}: needs --zero 1, 2 or 3 and a size >= 2 (0 shards "
                              "over every data-parallel rank; 1 would shard nothing: that is --zero 0)")
        if self.prefetch < 1:
            raise ConfigError(f"--zero-prefetch must be >= 1, got {self.prefetch}")
        if self.zero == 3 and not self.overlap_param_gather:
            raise ConfigError("--zero 3 gathers each parameter bucket just ahead of the layers that read it; it cannot "
                              "gather them all at the end of the step (overlap_param_gather false): that is --zero 2")
        ranks = grid.dp_size * getattr(grid, "cp_size", 1) if grid is not None else 0
        if grid is not None and self.shard_size and ranks % self.shard_size:
            raise ConfigError(f"--zero-shard-size {self.shard_size} does not divide the {ranks} data-parallel ranks "
                              "(dp x cp)")
        _choice(self.grad_dtype, tuple(DP_GRAD_DTYPES), "data_parallel.grad_dtype (--dp-grad-dtype)")
        if not self.bucket_mb > 0:
            raise ConfigError(f"the DP bucket size must be positive, got {self.bucket_mb} MiB")
        if not self.bucket_mb <= MAX_BUCKET_MB:  # also nan and inf; the C++ core takes the size in bytes
            raise ConfigError(f"data_parallel.bucket_mb must be at most {MAX_BUCKET_MB} MiB (1 TiB), got "
                              f"{self.bucket_mb}")

    @property
    def wire_dtype(self) -> torch.dtype | None:
        return DP_GRAD_DTYPES[self.grad_dtype]
