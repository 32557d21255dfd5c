"""Run configuration checks that need no process group: every rank runs them before the first collective,
so a bad configuration ends every rank with the same one-line message instead of a hang."""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import _C

from .engine_config import SCHEDULES, ConfigError  # noqa: F401  (one list of names: the C++ core's)


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int

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

        return LaunchEnv(read("RANK", 0), read("WORLD_SIZE", 1), read("LOCAL_RANK", 0))


def resolve_grid(dp: int | None, pp: int, mp: int, order: str, world_size: int) -> _C.ProcessGrid:
    """The grid for this launch; dp defaults to world / (pp * mp)."""
    for name, value in (("pp", pp), ("mp", mp)):
        if value < 1:
            raise ConfigError(f"--{name} must be >= 1, got {value}")
    if dp is None:
        if world_size % (pp * mp) != 0:
            raise ConfigError(
                f"world size {world_size} is not divisible by pp x mp = {pp} x {mp} = {pp * mp}; set --dp explicitly"
            )
        dp = world_size // (pp * mp)
    try:
        grid = _C.ProcessGrid(dp, pp, mp, order)
        grid.check_world_size(world_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return grid


def check_training(
    grid: _C.ProcessGrid,
    *,
    schedule: str,
    virtual_stages: int,
    depth: int,
    dim: int,
    batch_size: int,
    micro_batches: int,
    amp: str = "off",
    device_type: str = "cpu",
    lookahead: int = 0,
) -> None:
    """Everything about model, batch and schedule that can be wrong before training starts."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule '{schedule}' (expected one of {', '.join(SCHEDULES)})")
    if virtual_stages < 1:
        raise ConfigError(f"--virtual-stages must be >= 1, got {virtual_stages}")
    if schedule == "interleaved" and virtual_stages < 2:
        raise ConfigError("the interleaved schedule needs --virtual-stages >= 2 (it interleaves model chunks)")
    if schedule != "interleaved" and virtual_stages != 1:
        raise ConfigError(f"--virtual-stages {virtual_stages} needs --schedule interleaved (got {schedule})")
    if lookahead < 0:
        raise ConfigError(f"--lookahead must be >= 0, got {lookahead}")
    if lookahead > 0 and schedule not in ("1f1b", "zb1"):
        raise ConfigError(f"--lookahead applies to --schedule 1f1b and zb1 only (got {schedule})")
    if dim < 1 or depth < 1:
        raise ConfigError(f"--dim and --depth must be >= 1, got dim {dim}, depth {depth}")
    stages = grid.pp_size * virtual_stages
    if depth < stages:
        raise ConfigError(
            f"--depth {depth} is less than pp x virtual stages = {grid.pp_size} x {virtual_stages} = {stages}: "
            "every stage needs at least one layer"
        )
    if dim % grid.mp_size != 0:
        raise ConfigError(f"--dim {dim} is not divisible by --mp {grid.mp_size}")
    if micro_batches < 1:
        raise ConfigError(f"--micro-batches must be >= 1, got {micro_batches}")
    if batch_size < 1 or batch_size % (grid.dp_size * micro_batches) != 0:
        raise ConfigError(
            f"--batch-size {batch_size} is not divisible by dp x micro-batches = {grid.dp_size} x {micro_batches} "
            f"= {grid.dp_size * micro_batches}"
        )
    if schedule == "interleaved" and micro_batches % grid.pp_size != 0:
        raise ConfigError(
            f"the interleaved schedule needs --micro-batches divisible by --pp ({micro_batches} % {grid.pp_size} != 0)"
        )
    if amp == "fp16" and device_type != "cuda":
        raise ConfigError("--amp fp16 needs CUDA GPUs (fp16 matrix products are not supported on the CPU); use --amp bf16")
