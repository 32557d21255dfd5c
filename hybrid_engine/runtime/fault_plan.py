"""Fault injection for tests: a value the Trainer takes, never read from the environment inside the loop.

Tests that drive the Trainer in-process pass a FaultPlan; tests of the real driver (torchrun, plain processes)
use the documented environment variables, which the CLI turns into a FaultPlan at its edge
(`FaultPlan.from_test_environ`). They fire only on a run's first attempt, i.e. when torchrun's
TORCHELASTIC_RESTART_COUNT is 0 or unset, so a restarted run does not fail again:

  HYBRID_ENGINE_TEST_KILL_AT_STEP=S     rank HYBRID_ENGINE_TEST_KILL_RANK (default 0) SIGKILLs itself as step
                                        S begins (the others are then blocked mid-step, waiting for it)
  HYBRID_ENGINE_TEST_CRASH_IN_SAVE=S    that rank writes half its shard of the checkpoint of step S, then
                                        SIGKILLs itself
  HYBRID_ENGINE_TEST_NAN_AT_STEP=S      a NaN is written into the inputs of step S (so the loss is NaN)
  HYBRID_ENGINE_TEST_FREEZE_AT_STEP=S   rank HYBRID_ENGINE_TEST_KILL_RANK stops itself (SIGSTOP) as step S begins:
                                        the others wait on it mid-step until --comm-timeout, then say where
  HYBRID_ENGINE_TEST_OOM_AT_STEP=S      every rank raises torch.OutOfMemoryError as step S begins, under the plan
                                        the run started with (the planner's fallback takes another)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from hybrid_engine.config import ConfigError

PREFIX = "HYBRID_ENGINE_TEST_"


@dataclass(frozen=True)
class FaultPlan:
    """Which fault to inject where; the default injects nothing."""

    kill_at_step: int | None = None
    """`kill_rank` SIGKILLs itself as this step begins."""
    kill_rank: int = 0
    """The rank that dies (kill_at_step and crash_in_save)."""
    crash_in_save: int | None = None
    """`kill_rank` writes half its shard of this step's checkpoint, then SIGKILLs itself."""
    nan_at_step: int | None = None
    """The inputs of this step are NaN (so the loss is NaN on every rank)."""
    freeze_at_step: int | None = None
    """`kill_rank` stops itself (SIGSTOP) as this step begins: a frozen peer, mid-step for the others."""
    oom_at_step: int | None = None
    """Every rank runs out of memory (torch.OutOfMemoryError) as this step begins."""

    def kills(self, step: int, rank: int) -> bool:
        return self.kill_at_step == step and rank == self.kill_rank

    def crashes_in_save(self, step: int, rank: int) -> bool:
        return self.crash_in_save == step and rank == self.kill_rank

    def freezes(self, step: int, rank: int) -> bool:
        return self.freeze_at_step == step and rank == self.kill_rank

    def poisons(self, step: int) -> bool:
        return self.nan_at_step == step

    def runs_out_of_memory(self, step: int) -> bool:
        return self.oom_at_step == step

    @staticmethod
    def from_test_environ(environ: Mapping[str, str] = os.environ) -> "FaultPlan":
        """The HYBRID_ENGINE_TEST_* variables as a plan; nothing on a restarted attempt."""
        if environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return FaultPlan()

        def read(name: str) -> int | None:
            raw = environ.get(PREFIX + name)
            if raw is None:
                return None
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {PREFIX}{name}={raw!r} is not an integer") from None

        return FaultPlan(kill_at_step=read("KILL_AT_STEP"), kill_rank=read("KILL_RANK") or 0,
                         crash_in_save=read("CRASH_IN_SAVE"), nan_at_step=read("NAN_AT_STEP"),
                         freeze_at_step=read("FREEZE_AT_STEP"), oom_at_step=read("OOM_AT_STEP"))
