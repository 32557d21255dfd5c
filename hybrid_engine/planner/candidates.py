"""The plans the planner weighs: every schedule, virtual-stage count, merged W, lookahead and micro-batch count
that the run leaves unset, each legal for the grid. Legality is asked, never restated: the schedule's rules from
the C++ core (`_C.schedule.check_schedule_request`), the model's from its own check (models/registry.py), and the
batch must split into the micro-batches of every DP rank."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import hybrid_engine._C as _C

MAX_MICRO_BATCHES = 64
VIRTUAL_STAGES = (2, 4)
LOOKAHEADS = (0, 1)
# The reference plan (the engine's long-standing default): what the CPU keeps, and how ties are broken.
REFERENCE = ("1f1b", 4)
SCHEDULE_ORDER = ("1f1b", "zb1", "interleaved", "gpipe", "naive")


@dataclass(frozen=True)
class Plan:
    """One way to run a step: the schedule and its knobs."""

    schedule: str
    micro_batches: int
    virtual_stages: int = 1
    lookahead: int = 0
    merge_wgrad: bool = False

    def describe(self) -> str:
        name = self.schedule + (" + merged W" if self.merge_wgrad else "")
        if self.virtual_stages > 1:
            name += f" (v{self.virtual_stages})"
        if self.lookahead:
            name += f" + lookahead {self.lookahead}"
        return f"{name}, {self.micro_batches} micro-batch{'' if self.micro_batches == 1 else 'es'}"

    def flags(self) -> str:
        """The driver's flags that give this plan by hand, every schedule field named."""
        return (f"--schedule {self.schedule} --micro-batches {self.micro_batches} --virtual-stages "
                f"{self.virtual_stages} --lookahead {self.lookahead} "
                f"{'--merge-wgrad' if self.merge_wgrad else '--no-merge-wgrad'}")

    def reference_distance(self) -> tuple:
        """How far from the reference plan: the CPU's choice, and every tie's breaker (simpler first)."""
        name, m = REFERENCE
        order = SCHEDULE_ORDER.index(self.schedule) if self.schedule in SCHEDULE_ORDER else len(SCHEDULE_ORDER)
        return (order, abs(math.log(self.micro_batches / m)), self.micro_batches, self.virtual_stages,
                self.merge_wgrad, self.lookahead)


@dataclass(frozen=True)
class Request:
    """What the user fixed (None: the planner's to choose)."""

    schedule: str | None = None
    micro_batches: int | None = None
    virtual_stages: int | None = None
    lookahead: int | None = None
    merge_wgrad: bool | None = None

    @staticmethod
    def of(s) -> "Request":
        """The request of a ScheduleConfig whose unset fields are 'auto' or None."""
        return Request(None if s.name == "auto" else s.name, s.micro_batches, s.virtual_stages, s.lookahead,
                       s.merge_weight_grads)


def micro_batch_counts(per_dp: int) -> list[int]:
    """Every count that splits a DP rank's rows evenly, up to MAX_MICRO_BATCHES."""
    return [m for m in range(1, min(per_dp, MAX_MICRO_BATCHES) + 1) if per_dp % m == 0]


def candidates(request: Request, per_dp: int, legal: Callable[[Plan], bool]) -> Iterator[Plan]:
    """Every plan that keeps what the request fixes and that legal(plan) accepts: the configuration's own checks
    (config/checks.py check_training, the C++ core's schedule rules, the model's stage count), never restated."""
    names = [request.schedule] if request.schedule else list(_C.schedule.schedule_names())
    counts = [request.micro_batches] if request.micro_batches is not None else micro_batch_counts(per_dp)
    for name in names:
        # every chunk count; the schedule's own rule (the C++ core's, through legal) keeps the ones it runs
        vs = [request.virtual_stages] if request.virtual_stages is not None else (1, *VIRTUAL_STAGES)
        merges = [request.merge_wgrad] if request.merge_wgrad is not None else (False, True)
        aheads = [request.lookahead] if request.lookahead is not None else LOOKAHEADS
        for v in vs:
            for m in counts:
                for merge in merges:
                    for k in aheads:
                        plan = Plan(name, m, v, k, merge)
                        if legal(plan):
                            yield plan
