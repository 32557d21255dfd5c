"""The choice: every candidate plan predicted (step time from step_time.py, peak memory from memory.py), those over
the memory cap set aside, the fastest kept (on a card whose rates the planner does not trust, the CPU, the plan
nearest the reference instead), and one line that says it beside the runner-up."""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Callable

from .candidates import Plan, Request, candidates
from .card import GIB, Card
from .memory import CAP_MARGIN, RankPeak, fits, peak_bytes, usable_bytes
from .model_shape import ModelShape
from .setting import Setting
from .step_time import StepTime, step_time


NEAR = 0.01


class NoPlanFits(ValueError):
    """No legal plan fits the memory (or none is legal); the message is the one line a user sees; least: the plan
    needing the least memory, when some was legal."""

    def __init__(self, message: str, least: "Prediction | None" = None):
        super().__init__(message)
        self.least = least


@dataclass(frozen=True)
class Prediction:
    """A plan with what the planner predicts of it."""

    plan: Plan
    time: StepTime
    ranks: tuple[RankPeak, ...]

    @property
    def step_s(self) -> float:
        return self.time.step_s

    @property
    def peaks(self) -> tuple[float, ...]:
        """Each pipeline rank's predicted allocated peak (what torch.cuda.max_memory_allocated measures)."""
        return tuple(r.total for r in self.ranks)

    @property
    def peak(self) -> float:
        return max(self.peaks)

    @property
    def needed(self) -> float:
        """The device memory the most loaded rank needs: the allocator's overhead and what lives outside it."""
        return max(r.needed for r in self.ranks)

    def fits(self, cap: float) -> bool:
        return fits(list(self.ranks), cap)

    def brief(self) -> str:
        return f"{self.plan.describe()}: {self.step_s * 1e3:.3g} ms, {self.peak / GIB:.1f} GiB"


def predict(shape: ModelShape, card: Card, s: Setting, plan: Plan, cap: float | None = None) -> Prediction:
    """The plan's step and peaks; under --cuda-graphs auto, eager where the replayed step is faster but its graphs'
    memory does not fit the cap (default: the card's memory) and the eager step's does (the run's own choice,
    parallel/pipeline/graphs.py)."""
    cap = card.memory_bytes if cap is None else cap
    t = step_time(shape, card, s, plan)
    peaks = tuple(peak_bytes(shape, s, plan, card.workspace_bytes, t.graphs))
    if t.graphs and s.cuda_graphs == "auto" and not fits(list(peaks), cap):
        eager = tuple(peak_bytes(shape, s, plan, card.workspace_bytes))
        if fits(list(eager), cap):
            return Prediction(plan, step_time(shape, card, dataclasses.replace(s, cuda_graphs="off"), plan), eager)
    return Prediction(plan, t, peaks)


@dataclass(frozen=True)
class Choice:
    """The chosen plan, the runner-up, and every plan weighed (fastest first), with the cap they were held to."""

    chosen: Prediction
    runner_up: Prediction | None
    ranked: tuple[Prediction, ...]
    over_cap: tuple[Prediction, ...]
    cap: float
    card: Card
    by_time: bool

    def line(self, filled: bool = True) -> str:
        """The line rank 0 prints: the choice, its prediction, the runner-up (a card the cost model does not time,
        the CPU, gets the reference plan and no prediction)."""
        c = self.chosen
        head = "plan: " if filled else "plan (as given): "
        flags = f" (as flags: {c.plan.flags()})"
        if not self.by_time:
            return (f"{head}{c.plan.describe()} (the {self.card.name} keeps the plan nearest 1f1b x 4 micro-batches: "
                    "the cost model times GPUs; python -m hybrid_engine.plan --plan-card h100 ranks the plans for "
                    f"one){flags}")
        text = f"{head}{c.plan.describe()}: predicted {c.step_s * 1e3:.3g} ms/step, {gib(c.peak)} GiB peak"
        if self.runner_up is not None:
            r = self.runner_up
            text += f" (runner-up {r.plan.describe()}: {r.step_s * 1e3:.3g} ms, {gib(r.peak)} GiB)"
        return text + flags


def gib(nbytes: float) -> str:
    """A memory size in GiB to three significant digits (0.0412, 1.87, 61.4)."""
    return f"{nbytes / GIB:.3g}"


def choose(shape: ModelShape, card: Card, s: Setting, request: Request, legal: Callable[[Plan], bool],
           cap_bytes: float | None = None) -> Choice:
    """The fastest legal plan within the cap (default: the card's memory) that keeps what `request` fixes; raises
    NoPlanFits with one line when none is legal or none fits."""
    cap = cap_bytes if cap_bytes is not None else card.memory_bytes
    weighed = [predict(shape, card, s, plan, cap) for plan in candidates(request, s.per_dp, legal)]
    if not weighed:
        why = getattr(legal, "first_error", None)
        raise NoPlanFits(f"no legal plan for batch {s.batch_size} on dp x pp x mp = {s.dp} x {s.pp} x {s.mp} with "
                         f"the schedule flags given{': ' + why if why else ''}")
    fit = [p for p in weighed if p.fits(cap)]
    over = tuple(sorted((p for p in weighed if not p.fits(cap)), key=lambda p: p.needed))
    if not fit:
        least = over[0]
        raise NoPlanFits(f"no plan fits {cap / GIB:.1f} GiB per rank: the smallest, {least.plan.describe()}, needs "
                         f"{least.peak / GIB:.1f} GiB ({least.needed / GIB:.1f} with the allocator's overhead, "
                         f"{usable_bytes(cap) / GIB:.1f} usable) (raise --memory-cap-gib, add ranks, use a higher "
                         "--zero or --recompute full)", least)
    if card.search:
        # Within NEAR of the fastest, the plan nearest the reference wins: a prediction's last percent does not pay
        # for a less tried plan or for memory (merged W keeps every micro-batch's inputs).
        ranked = sorted(fit, key=lambda p: (p.step_s, p.plan.reference_distance()))
        near = [p for p in ranked if p.step_s <= ranked[0].step_s * (1 + NEAR)]
        first = min(near, key=lambda p: p.plan.reference_distance())
        ranked = [first] + [p for p in ranked if p is not first]
    else:
        ranked = sorted(fit, key=lambda p: p.plan.reference_distance())
    return Choice(ranked[0], runner_up(ranked), tuple(ranked), over, cap, card, card.search)


def after_out_of_memory(choice: Choice) -> Prediction | None:
    """The plan to take when the chosen one ran out of memory on its first step: the first other plan of the
    ranking (each fits the cap) predicted to need at least CAP_MARGIN less at its peak than the one that failed,
    whose prediction the failure showed short; None when there is none."""
    most = (1 - CAP_MARGIN) * choice.chosen.peak
    return next((p for p in choice.ranked[1:] if p.peak <= most), None)


def runner_up(ranked: list[Prediction]) -> Prediction | None:
    """The best plan of another kind (schedule, merged W) than the chosen one; else the second best."""
    kind = (ranked[0].plan.schedule, ranked[0].plan.merge_wgrad)
    other = [p for p in ranked[1:] if (p.plan.schedule, p.plan.merge_wgrad) != kind]
    return other[0] if other else (ranked[1] if len(ranked) > 1 else None)
