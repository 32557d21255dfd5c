"""The configuration's rules: every number range-checked, the grid resolved, batch and schedule checked,
each with one line that names the flag a user typed. RunConfig.validate (config/run.py) calls them in order; they
need no process group, so every rank runs them before the first collective."""
from __future__ import annotations

import math
import re

import hybrid_engine._C as _C
from .engine import ConfigError, ScheduleConfig

DEVICES = ("auto", "cpu", "cuda")
CP_COMMS = ("auto", "ring", "all-gather")  # hybrid_engine/planner/context_comm.py choose_comm
CP_KERNELS = ("auto", "cudnn", "flash")  # hybrid_engine/parallel/context/block_attention.py pick_backend
OPTIMIZERS = ("sgd", "adam", "adamw")  # hybrid_engine.optim.from_config builds each
DEFAULT_LR = {"sgd": 1e-2, "adam": 1e-3, "adamw": 1e-3}  # without --lr, for an optimizer that is not the model's own
LR_DECAYS = ("constant", "cosine", "linear")  # hybrid_engine/train/lr_schedule.py
MAX_RANKS = 2**16
MAX_INT = 2**31 - 1  # what the C++ core's int arguments hold
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range
MAX_LR = 3e38  # the largest learning rate an fp32 master can multiply: beyond it every step is inf
MAX_TIMEOUT_S = 7 * 24 * 3600.0


# ------------------------------------------------------------------------------------------------ numbers
def _in_range(flag: str, value, low, high, what: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number ({what}), got {value}")
    if not low <= value <= high:
        raise ConfigError(f"{flag} must be {what}, got {value}{_failed_bound(value, low, high, what)}")


def _failed_bound(value, low, high, what: str) -> str:
    """' (at most 2147483647)': the bound the value failed, where `what` does not already state it (it may name
    only the other bound, or a looser rule the value meets: 1e-9 GiB is positive, yet below the least)."""
    bound = low if value < low else high
    text = f"{bound:g}" if isinstance(bound, float) else str(bound)
    if re.search(rf"(?<![\w.+-]){re.escape(text)}(?![\w.])", what):
        return ""
    return f" ({'at least' if value < low else 'at most'} {text})"


def check_numbers(cfg) -> None:
    """Every number a user gives, range-checked with a message that names the real problem, before anything
    is built (a huge --dim would otherwise fail deep in torch after setup, a huge --lookahead in pybind)."""
    p, m, s, pr = cfg.parallel, cfg.model, cfg.schedule, cfg.precision
    if p.dp is not None and p.dp < 1:
        raise ConfigError(f"--dp must be >= 1, got {p.dp}")
    if p.cp < 1:
        raise ConfigError(f"--cp must be >= 1, got {p.cp}")
    if p.cp_comm not in CP_COMMS:
        raise ConfigError(f"parallel.cp_comm (--cp-comm) must be one of {', '.join(CP_COMMS)}, got {p.cp_comm!r}")
    if p.cp_kernel not in CP_KERNELS:
        raise ConfigError(f"parallel.cp_kernel (--cp-kernel) must be one of {', '.join(CP_KERNELS)}, "
                          f"got {p.cp_kernel!r}")
    for flag, value in (("--dp", p.dp), ("--cp", p.cp), ("--pp", p.pp), ("--mp", p.mp)):
        if value is not None and value > MAX_RANKS:
            raise ConfigError(f"{flag} {value} is too large (at most {MAX_RANKS} ranks per axis)")
    if p.device not in DEVICES:  # the flag's choices, for a --config file's value too (case matters: cuda)
        raise ConfigError(f"parallel.device (--device) must be one of {', '.join(DEVICES)}, got {p.device!r}")
    _in_range("--comm-timeout", p.comm_timeout, 1e-3, MAX_TIMEOUT_S,
              f"a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (a week)")
    if p.memory_cap_gib is not None:
        _in_range("--memory-cap-gib", p.memory_cap_gib, 1e-6, 1e6, "a positive number of GiB")
    _in_range("--seed", m.seed, 0, MAX_SEED, "in [0, 2^63 - 1] (a torch generator's seed)")
    if cfg.data.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {cfg.data.batch_size}")
    if cfg.data.batch_size > MAX_INT:
        raise ConfigError(f"--batch-size {cfg.data.batch_size} is too large (at most {MAX_INT})")
    for flag, value in (("--micro-batches", s.micro_batches), ("--virtual-stages", s.virtual_stages),
                        ("--lookahead", s.lookahead)):
        if value is not None and abs(value) > MAX_INT:  # the C++ core takes an int
            raise ConfigError(f"{flag} {value} is too large (at most {MAX_INT})")
    if cfg.optimizer.name not in OPTIMIZERS:
        raise ConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {cfg.optimizer.name!r}")
    _in_range("--lr", cfg.optimizer.lr, 0.0, MAX_LR, f"a learning rate in [0, {MAX_LR:g}]")
    check_optimizer(cfg.optimizer, cfg.training.steps)
    t = cfg.training
    _in_range("--steps", t.steps, 0, MAX_INT, "a number of steps >= 0 (0: set up and stop)")
    _in_range("--warmup", t.warmup, 0, MAX_INT, "a number of steps >= 0")
    _in_range("--log-every", t.log_every, 1, MAX_INT, "a number of steps >= 1")
    _in_range("--eval-every", t.eval_every, 0, MAX_INT, "a number of steps >= 0 (0: never)")
    _in_range("--spike-factor", t.spike_factor, 0.0, 3.0e38, "0 (off) or a factor > 1")
    if 0 < t.spike_factor <= 1:
        raise ConfigError(f"--spike-factor must be 0 (off) or a factor > 1, got {t.spike_factor}")
    if pr.loss_scale is not None:
        _in_range("--loss-scale", pr.loss_scale, 1e-30, 3.0e38, "a positive loss scale")
    _in_range("--scale-window", pr.scale_window, 1, MAX_INT, "a number of clean steps >= 1")
    _in_range("--hysteresis", pr.hysteresis, 1, MAX_INT, "a number of overflows >= 1 (1: halve at the first)")
    if pr.clip_grad is not None:
        _in_range("--clip-grad", pr.clip_grad, 0.0, 3.0e38, "a gradient norm >= 0 (0: off)")
    c = cfg.checkpoint
    if c.save_every < 0 or c.keep < 1:
        raise ConfigError(f"--save-every must be >= 0 and --keep-checkpoints >= 1, got {c.save_every} and {c.keep}")


def parse_betas(text: str) -> tuple[float, float]:
    """--betas B1,B2: two numbers in [0, 1)."""
    try:
        b1, b2 = (float(b) for b in text.split(","))
    except ValueError:
        raise ConfigError(f"--betas takes two numbers B1,B2 (e.g. 0.9,0.95), got {text!r}") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ConfigError(f"--betas must be two numbers in [0, 1), got {text!r}")
    return b1, b2


def check_optimizer(o, steps: int) -> None:
    """The optimizer's flags and its lr schedule's, each against the optimizer that takes it."""
    if o.lr_decay not in LR_DECAYS:
        raise ConfigError(f"--lr-decay must be one of {', '.join(LR_DECAYS)}, got {o.lr_decay!r}")
    _in_range("--lr-warmup", o.lr_warmup, 0, MAX_INT, "a number of steps >= 0")
    _in_range("--min-lr", o.min_lr, 0.0, o.lr, f"a learning rate in [0, --lr {o.lr:g}]")
    if o.lr_decay_steps is not None:
        _in_range("--lr-decay-steps", o.lr_decay_steps, 0, MAX_INT, "a step >= 0")
    given = [f for f, said in (("--min-lr", o.min_lr != 0), ("--lr-decay-steps", o.lr_decay_steps is not None)) if said]
    if o.lr_decay == "constant" and given:  # a constant lr never reaches them: refused, never ignored
        both = len(given) > 1
        raise ConfigError(f"{' and '.join(given)} appl{'y' if both else 'ies'} to --lr-decay cosine or linear only "
                          f"(got constant: the lr stays at --lr); add --lr-decay cosine or linear, or leave "
                          f"{'them' if both else 'it'} out")
    if o.lr_decay != "constant" and (o.lr_decay_steps if o.lr_decay_steps is not None else steps) <= o.lr_warmup:
        raise ConfigError(f"--lr-decay {o.lr_decay} needs --lr-decay-steps (default --steps) past --lr-warmup "
                          f"{o.lr_warmup}: there are no steps left to decay over")
    if o.weight_decay is not None:
        if o.name != "adamw":
            raise ConfigError(f"--weight-decay applies to --optimizer adamw only (got {o.name})")
        _in_range("--weight-decay", o.weight_decay, 0.0, 1e6, "a decay rate >= 0")
    if o.betas is not None:
        if o.name == "sgd":
            raise ConfigError("--betas applies to --optimizer adam and adamw only (got sgd)")
        parse_betas(o.betas)


# ------------------------------------------------------------------------------------------------ grid and training
def resolve_grid(dp: int | None, pp: int, mp: int, order: str, world_size: int, cp: int = 1) -> _C.ProcessGrid:
    """The grid for this launch; dp defaults to world / (cp * pp * mp). The sizes' and the order's rules are the
    C++ grid's (csrc/grid/process_grid.h), asked before dp is derived from the others."""
    try:
        _C.ProcessGrid(1 if dp is None else dp, pp, mp, order, cp=cp)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if dp is None:
        named = [(name, value) for name, value in (("cp", cp), ("pp", pp), ("mp", mp)) if name != "cp" or cp > 1]
        others = math.prod(value for _, value in named)
        if world_size % others != 0:
            raise ConfigError(
                f"world size {world_size} is not divisible by {' x '.join(n for n, _ in named)} = "
                f"{' x '.join(str(v) for _, v in named)} = {others}; set --dp explicitly"
            )
        dp = world_size // others
    try:
        grid = _C.ProcessGrid(dp, pp, mp, order, cp=cp)
        grid.check_world_size(world_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return grid


def check_training(
    grid: _C.ProcessGrid,
    *,
    schedule: str,
    virtual_stages: int | None,
    batch_size: int,
    micro_batches: int | None,
    amp: str = "off",
    device_type: str = "cpu",
    lookahead: int | None = 0,
    merge_weight_grads: bool | None = False,
) -> None:
    """Everything about batch and schedule that can be wrong before training starts (each model checks its own
    shape: models/registry.py). The schedule's own rules are the C++ core's (ScheduleConfig.check_rules), the
    same that `python -m hybrid_engine.schedule` asks. A field left to the planner (auto: 'auto' or None) is not
    checked here: the planner's plan is, through this same function."""
    ScheduleConfig(schedule, micro_batches, virtual_stages, lookahead, merge_weight_grads).check_rules(grid.pp_size)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    if micro_batches and batch_size % (grid.dp_size * micro_batches) != 0:  # < 1: the C++ core's to refuse
        raise ConfigError(
            f"--batch-size {batch_size} is not divisible by dp x micro-batches = {grid.dp_size} x {micro_batches} "
            f"= {grid.dp_size * micro_batches}"
        )
    if amp == "fp16" and device_type != "cuda":
        raise ConfigError("--amp fp16 needs CUDA GPUs (fp16 matrix products are not supported on the CPU); use --amp bf16")
