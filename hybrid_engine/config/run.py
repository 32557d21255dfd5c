"""A run's typed configuration: one frozen dataclass per concern, each field documented, validated once.

The engine's own configuration (schedule, stages, precision, data parallel) lives in config/engine.py; this file
adds what a run needs around the engine (grid, model, data, optimizer, training loop, checkpoints, reporting)
and `RunConfig`, which holds them all. The command line (hybrid_engine/train/cli.py) and a TOML file (`--config
run.toml`, one table per field of RunConfig: `[parallel]`, `[schedule]`, ...) both fill a RunConfig.

`RunConfig.validate` runs on every rank before the first collective, so a bad configuration ends every rank
with the same one-line message instead of a hang. Schedule names and rules come from the C++ core
(ScheduleConfig.validate); the rules in config/checks.py name the flag a user typed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import hybrid_engine._C as _C
from .checks import (CP_COMMS, CP_KERNELS, DEFAULT_LR, DEVICES, LR_DECAYS, OPTIMIZERS, check_numbers, check_training,
                     resolve_grid)
from .fields import flag
from .engine import ConfigError, DataParallelConfig, PrecisionConfig, ScheduleConfig, StageConfig
from .plan import PlanConfig


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    launched: bool = True
    """False for a plain `python hybrid_engine.py` (no RANK / WORLD_SIZE from a launcher)."""
    attempt: int = 0
    """Which attempt of the run this is: torchrun's TORCHELASTIC_RESTART_COUNT (0: the first)."""

    @staticmethod
    def from_environ() -> "LaunchEnv":
        """torchrun's variables; a plain `python hybrid_engine.py` is one rank."""

        def read(name: str, default: int) -> int:
            raw = os.environ.get(name)
            if raw is None:
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None

        return LaunchEnv(read("RANK", 0), read("WORLD_SIZE", 1), read("LOCAL_RANK", 0),
                         launched="WORLD_SIZE" in os.environ, attempt=read("TORCHELASTIC_RESTART_COUNT", 0))


# ------------------------------------------------------------------------------------------------ the run's parts
@dataclass(frozen=True)
class ParallelConfig:
    """The process grid and where it runs (hybrid_engine/parallel/grid.py, csrc/grid)."""

    dp: int | None = field(default=None, metadata=flag(metavar="N"))
    """Data-parallel replicas; None: world size / (cp * pp * mp)."""
    cp: int = field(default=1, metadata=flag(metavar="N"))
    """Context-parallel ranks (GPT, Llama): each sequence split over N ranks, two chunks each, one from the front
    and its mirror from the back (--seq-len divisible by 2 N); attention over the whole sequence by a ring of K/V
    blocks or an all-gather of K/V (--cp-comm); gradients summed over dp x cp."""
    cp_comm: str = field(default="auto", metadata=flag(choices=CP_COMMS))
    """auto (whichever leaves less K/V transfer time exposed on the --plan-card's rates: the ring once a block's
    attention hides its hops, else the all-gather; said at start) | ring (K/V blocks pass around the cp ranks
    under the attention of the block before) | all-gather (the whole sequence's K/V gathered once per layer)."""
    cp_kernel: str = field(default="auto", metadata=flag(choices=CP_KERNELS))
    """auto (the attention kernel torch's SDPA runs for the blocks' shapes: cuDNN's on Hopper, else flash; said at
    start) | cudnn | flash: the kernel of the context-parallel attention blocks on CUDA (the CPU has one)."""
    pp: int = field(default=1, metadata=flag(metavar="N"))
    """Pipeline-parallel stages (ranks per pipeline)."""
    mp: int = field(default=1, metadata=flag(metavar="N"))
    """Tensor (model) parallel ranks per layer."""
    order: str = field(default="mp-dp-pp", metadata=flag(metavar="AXES"))
    """mp-dp-pp, mp-pp-dp, dp-mp-pp, dp-pp-mp, pp-mp-dp or pp-dp-mp: the rank layout, axes fastest-varying first;
    the default keeps MP peers on adjacent ranks (one node, NVLink) and pipeline stages outermost."""
    device: str = field(default="auto", metadata=flag(choices=DEVICES))
    """auto: CUDA + NCCL when GPUs exist, else CPU + gloo; cpu; cuda."""
    comm_timeout: float = field(default=60.0, metadata=flag(metavar="SECONDS"))
    """Seconds a collective may wait for a peer before this rank gives up."""
    memory_cap_gib: float | None = field(default=None, metadata=flag(metavar="GIB"))
    """The memory a rank may use: the planner's cap (no plan predicted above it is chosen; none: the device's memory)
    and, on CUDA, what this process may allocate (a smaller card's limit)."""
    allow_cross_node_mp: bool = False
    """Run even when an MP group spans hosts (its all-reduces then cross the network every layer); without it such
    a grid is refused before the first step."""


@dataclass(frozen=True)
class ModelConfig:
    """The model trained, by name, its seed, and that model's own options: each model's options class
    (models/<name>/options.py, listed in models/registry.py) adds its keys to [model] and its flags."""

    name: str = field(default="mlp", metadata=flag("--model"))
    """Which model, by its name in the registry (models/registry.py; --help's description says what each is). A
    run that starts from a checkpoint with a model.toml beside it (--load, --resume) takes that model and its
    options, under --config and flags."""
    seed: int = 0
    """Initial weights and data depend on this alone, never on the grid."""
    options: object = field(default=None, metadata={"model_options": True})
    """The chosen model's options (an instance of its options class); None: the defaults, once a registry says
    which class that is."""

    def __getattr__(self, key: str):
        """cfg.model.<option> reads the chosen model's option."""
        options = object.__getattribute__(self, "options")
        if options is not None and key in {f.name for f in dataclasses.fields(options)}:
            return getattr(options, key)
        raise AttributeError(f"model {object.__getattribute__(self, 'name')!r} has no option {key!r}")


@dataclass(frozen=True)
class DataConfig:
    """What each step trains on, drawn from (seed, step) alone: a text (--data) for the GPT and the Llama, else the
    model's own data (the MLP's regression onto a fixed teacher, the decoders' seeded Markov corpus)."""

    batch_size: int = field(default=64, metadata=flag(metavar="B"))
    """Global batch size (all DP replicas together): samples for the MLP, sequences for the GPT and the Llama."""
    path: str | None = field(default=None, metadata=flag("--data", metavar="PATH"))
    """GPT, Llama: a text file (byte-level tokens) or a token file from `python -m hybrid_engine.data prepare`; none:
    the built-in corpus drawn from a seeded Markov chain with a known entropy rate."""
    stream: bool = field(default=False, metadata=flag("--stream-data"))
    """Draw each micro-batch when its forward runs instead of the whole batch before the step: the batch is never
    resident (a larger largest batch), for a few kernels per micro-batch."""


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer, by name, and its learning-rate schedule (hybrid_engine/optim/optimizers.py,
    hybrid_engine/train/lr_schedule.py; Engine users pass any factory instead)."""

    name: str | None = field(default=None, metadata=flag("--optimizer", choices=OPTIMIZERS))
    """sgd (plain: fused with the half-weight cast under --amp) | adam | adamw (decoupled weight decay, never on
    norms, biases or embeddings); none: the model's own, sgd for the MLP and adamw for the GPT and the Llama."""
    lr: float | None = None
    """Learning rate, the peak of the schedule (--lr-warmup, --lr-decay); none: the model's own for its optimizer
    (the MLP's sgd 10, the GPT's and the Llama's adamw 3e-3), else 0.01 for sgd and 0.001 for adam(w)."""
    lr_warmup: int = field(default=0, metadata=flag(metavar="N"))
    """Steps of linear warm-up: step t < N trains at lr (t + 1) / N."""
    lr_decay: str = field(default="constant", metadata=flag(choices=LR_DECAYS))
    """constant | cosine | linear: how the lr falls from --lr to --min-lr between the warm-up's end and
    --lr-decay-steps (then it stays at --min-lr)."""
    min_lr: float = 0.0
    """The lr the decay ends at."""
    lr_decay_steps: int | None = field(default=None, metadata=flag(metavar="N"))
    """The step at which the decay reaches --min-lr (none: --steps)."""
    weight_decay: float | None = None
    """adamw: decoupled weight decay, on matrices only: never on norms, biases or embeddings (nor an LM head tied
    to one); none: 0.01, torch's default."""
    betas: str | None = field(default=None, metadata=flag(metavar="B1,B2"))
    """adam, adamw: the moments' decay rates, e.g. 0.9,0.95; none: 0.9,0.999, torch's default."""

    def for_model(self, options: type) -> "OptimizerConfig":
        """This config with what it leaves unset filled from the model's options class (its OPTIMIZER)."""
        name, lr = options.OPTIMIZER
        chosen = self.name or name
        return replace(self, name=chosen,
                       lr=self.lr if self.lr is not None else lr if chosen == name else DEFAULT_LR[chosen])


@dataclass(frozen=True)
class TrainingConfig:
    """The training loop (hybrid_engine/train/trainer.py)."""

    steps: int = field(default=10, metadata=flag(metavar="N"))
    """Optimizer steps in all, counted from step 0 (a resumed run continues at its checkpoint's step); 0: set up,
    print the grid, stop."""
    warmup: int = field(default=2, metadata=flag(metavar="N"))
    """The first steps this run takes that the timing summary leaves out."""
    log_every: int = field(default=1, metadata=flag(metavar="N"))
    """Print a step line every N steps (when stdout is not a terminal; a terminal gets one live status line)."""
    eval_every: int = field(default=0, metadata=flag(metavar="N"))
    """GPT, Llama: every N steps (and after the last), the loss on the held-out last ~1% of the data (0: never)."""
    spike_factor: float = field(default=10.0, metadata=flag(metavar="F"))
    """Stop when a step's loss is more than this many times the largest of the 20 before it (0: never); a
    checkpoint becomes `latest` only once the step that trains on it has a finite loss within this factor."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints (hybrid_engine/checkpoint/saving.py; docs/failures.md)."""

    save: str | None = field(default=None, metadata=flag(metavar="DIR"))
    """Write checkpoints under this directory (DIR/step_N, DIR/latest); it must be visible to every rank."""
    save_every: int = field(default=0, metadata=flag(metavar="N"))
    """Also save after every N steps (0: only after the last step)."""
    keep: int = field(default=3, metadata=flag("--keep-checkpoints", metavar="K"))
    """Keep the newest K checkpoints."""
    resume: bool = False
    """Continue from the latest checkpoint in `save` if there is one, else start as usual (from `load`, or from
    scratch): what a restarted job (torchrun --max-restarts) needs."""
    load: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Start from this checkpoint (DIR/step_N, or a save directory: its latest), on any grid."""


@dataclass(frozen=True)
class ReportingConfig:
    """What the run writes besides checkpoints (rank 0)."""

    metrics: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Write one JSON line per step to this file."""
    quiet: bool = False
    """No per-step lines, only the summary."""
    trace: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Time every action of the last step; write PATH.json (Chrome trace), PATH.png and PATH.simulated.png."""
    tensorboard: str | None = field(default=None, metadata=flag(metavar="DIR"))
    """Write every step's metrics (loss, validation loss, lr, samples/s and tokens/s, step time, peak memory, loss
    scale, gradient norm) as TensorBoard scalars under DIR (needs the tensorboard package)."""


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; each field is one table of a `--config` TOML file."""

    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """[parallel]: the grid, the device, the communication timeout."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """[model]: which model, its sizes and seed."""
    data: DataConfig = field(default_factory=DataConfig)
    """[data]: the global batch, streamed or not."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """[optimizer]: name, learning rate and its schedule, weight decay, betas."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """[training]: steps, warm-up, how often to log."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """[checkpoint]: where and how often to save, what to resume or load."""
    reporting: ReportingConfig = field(default_factory=ReportingConfig)
    """[reporting]: metrics file, quiet, trace."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig.planned)
    """[schedule]: the engine's pipeline schedule (config/engine.py); what it leaves to auto, the planner fills."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    """[plan]: the planner's card and whether to stop after planning (config/plan.py)."""
    stages: StageConfig = field(default_factory=StageConfig)
    """[stages]: how each stage computes (config/engine.py)."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """[precision]: mixed precision and the loss scaler (config/engine.py)."""
    data_parallel: DataParallelConfig = field(default_factory=DataParallelConfig)
    """[data_parallel]: gradient buckets and their wire dtype (config/engine.py)."""

    @staticmethod
    def from_tables(tables: dict, models: Mapping[str, type], source: str = "the configuration") -> "RunConfig":
        """A RunConfig from {table: {field: value}} (a parsed TOML file, flags laid over it); an unknown table or
        key, or a value of the wrong type, is one ConfigError naming it. models: each model's options class by
        name (models/registry.py options()), which says what [model] may hold besides name and seed."""
        parts = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}  # type: ignore[misc]
        unknown = sorted(set(tables) - set(parts))
        if unknown:
            raise ConfigError(f"{source}: unknown table{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(f'[{t}]' for t in unknown)} (expected {', '.join(parts)})")
        built = {}
        for name, cls in parts.items():
            values = tables.get(name, {})
            if not isinstance(values, dict):
                raise ConfigError(f"{source}: '{name}' must be a table ([{name}]), got {values!r}")
            if cls is ModelConfig:
                built[name] = _model_config(values, models, source)
                continue
            built[name] = _build(type(cls()), name, values, source, cls)
        built["optimizer"] = built["optimizer"].for_model(models[built["model"].name])
        return RunConfig(**built)

    def validate(self, world_size: int, device_type: str,
                 model_rules: Callable[["RunConfig", _C.ProcessGrid, str], None]) -> _C.ProcessGrid:
        """Every check that needs no process group, in one place; returns the grid. Raises ConfigError.
        model_rules(cfg, grid, device_type): the chosen model's own (models/registry.py check_model), run first
        once the grid is known, so a model's mistakes are said in its own words."""
        check_numbers(self)
        self.model.options.check()
        p, s = self.parallel, self.schedule
        grid = resolve_grid(p.dp, p.pp, p.mp, p.order, world_size, cp=p.cp)
        model_rules(self, grid, device_type)
        # What the schedule leaves to auto is checked once the planner has filled it (the same checks, again).
        check_training(grid, schedule=s.name, virtual_stages=s.virtual_stages, batch_size=self.data.batch_size,
                       micro_batches=s.micro_batches, amp=self.precision.amp, device_type=device_type,
                       lookahead=s.lookahead, merge_weight_grads=s.merge_weight_grads)
        if p.cp_kernel != "auto" and device_type != "cuda":
            raise ConfigError(f"--cp-kernel {p.cp_kernel} chooses between CUDA kernels; on the CPU the blocks run "
                              "aten's flash-for-CPU kernel (leave it auto)")
        self.stages.validate()
        self.precision.validate()
        self.data_parallel.validate(grid)
        c = self.checkpoint
        if (c.resume or c.save_every) and not c.save:
            raise ConfigError("--resume and --save-every need --save DIR (to continue from a checkpoint elsewhere, "
                              "use --load PATH)")
        return grid


def _build(cls: type, table: str, values: dict, source: str, default=None):
    """cls(**values) (or default() with values laid over it), each key known and of its field's type, or one
    ConfigError naming the key."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    odd = sorted(set(values) - set(fields))
    if odd:
        raise ConfigError(f"{source}: unknown key{'s' if len(odd) > 1 else ''} "
                          f"{', '.join(f'{table}.{k}' for k in odd)} (expected one of {', '.join(fields)})")
    values = {k: fields[k].metadata.get("bools", {}).get(v, v) if isinstance(v, bool) else v for k, v in values.items()}
    values = {k: fields[k].metadata.get("words", {}).get(v, v) if isinstance(v, str) else v for k, v in values.items()}
    for key, value in values.items():
        _check_type(f"{source}: {table}.{key}", value, fields[key].type)
    return dataclasses.replace(default(), **values) if default is not None else cls(**values)


def _model_config(values: dict, models: Mapping[str, type], source: str) -> ModelConfig:
    """[model]: name and seed, and the rest the chosen model's options; an option of another model is said so."""
    values = dict(values)
    name = values.pop("name", ModelConfig.name)
    if name not in models:
        raise ConfigError(f"model must be one of {', '.join(models)}, got {name!r}")
    seed = values.pop("seed", ModelConfig.seed)
    _check_type(f"{source}: model.seed", seed, "int")
    own = {f.name for f in dataclasses.fields(models[name])}
    stray = [k for k in values if k not in own and any(k in {f.name for f in dataclasses.fields(c)}
                                                        for c in models.values())]
    if stray:
        flags = ", ".join("--" + k.replace("_", "-") for k in stray)
        owners = sorted({m for m, c in models.items() for k in stray if k in {f.name for f in dataclasses.fields(c)}})
        raise ConfigError(f"{flags} {'apply' if len(stray) > 1 else 'applies'} to --model {' or '.join(owners)} only "
                          f"(this run trains --model {name})")
    return ModelConfig(name, seed, _build(models[name], "model", values, source))


def _check_type(where: str, value, annotation: str) -> None:
    kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
    base = annotation.replace(" | None", "")
    if value is None and base != annotation:
        return
    ok = kinds.get(base)
    if ok is None:  # not a simple field (e.g. a nested dataclass): let the constructor decide
        return
    if not isinstance(value, ok) or (base != "bool" and isinstance(value, bool)):
        noun = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[base]
        raise ConfigError(f"{where} must be {noun}, got {value!r}")
