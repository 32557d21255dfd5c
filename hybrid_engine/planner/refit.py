"""A cost model that learns from the run: after its first measured steps, the card's terms are refitted to what the
run measured, every plan is predicted again, and the engine is told whether to switch.

Two terms are fitted, and with --trace a third: a compute scale (the run's GEMM, attention and elementwise time
over the table's: a card's real efficiency on this model) and a host cost per layer action (launches, the executor's and autograd's
bookkeeping). With --trace the executor times every action: each stage's median F, B, I and W against the model's
compute and layer count for it is a least-squares fit of both, and the DP gradient collectives' bytes over the time
they were in flight give the link's rate. Without it the step time alone fits the scale.

The switch happens once, in place: only to a plan of the same stages (virtual-stage count and placement), which
the engine reschedules without rebuilding a stage (Engine.reschedule). A faster plan of other stages is printed as
a recommendation to restart with. Every rank computes the same refit from the same all-gathered measurements.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Callable

from hybrid_engine.parallel.pipeline.schedule import schedule_placement

from .candidates import Plan, Request
from .card import Card
from .choose import Choice, Prediction, choose, predict
from .model_shape import ModelShape, shape_of
from .setting import Setting
from .step_time import stage_costs

MEASURED_STEPS = 3  # steps after the warm-up that the refit reads
SWITCH_GAIN = 0.05  # another plan must be predicted this much faster to be switched to
KINDS = ("F", "B", "I", "W")
MIN_SCALE = 1e-3  # compute is never free: a host-bound fit keeps this much of the table's compute


@dataclass(frozen=True)
class Refit:
    """What the refit found: its card, the running plan and the fastest ones predicted under it, the decision."""

    card: Card
    table: Card
    """The card before the refit."""
    current: Prediction
    best_in_place: Prediction
    best: Prediction
    measured_s: float

    @property
    def switch(self) -> bool:
        return (self.best_in_place.plan != self.current.plan
                and self.current.step_s > (1 + SWITCH_GAIN) * self.best_in_place.step_s)

    def line(self, step: int, fitted_by: str) -> str:
        """The one line rank 0 prints."""
        c, gain = self.current, (lambda p: (1 - p.step_s / self.current.step_s) * 100)
        host = (f"{self.card.host_action_s * 1e6:.0f} us a layer action" if self.card.host_action_s is not None
                else "the table's cost per layer action")
        if self.card.allreduce_bytes_s != self.table.allreduce_bytes_s:
            host += f", DP collectives at {self.card.allreduce_bytes_s / 1e9:.3g} GB/s"
        text = (f"planner: refit from {fitted_by}: compute x{self.card.compute_scale:.3g} the table's, {host}; "
                f"{c.plan.describe()} predicted "
                f"{c.step_s * 1e3:.4g} ms/step (measured {self.measured_s * 1e3:.4g})")
        if self.switch:
            b = self.best_in_place
            return (text + f"; {b.plan.describe()} predicted {b.step_s * 1e3:.4g} ms ({gain(b):.0f}% faster): "
                           f"switching to it from step {step} (as flags: {b.plan.flags()})")
        b = self.best
        if b.plan != c.plan and c.step_s > (1 + SWITCH_GAIN) * b.step_s:
            return (text + f"; {b.plan.describe()} predicted {b.step_s * 1e3:.4g} ms ({gain(b):.0f}% faster) needs "
                           f"other stages: restart with {b.plan.flags()}")
        return text + f"; no plan is predicted more than {SWITCH_GAIN:.0%} faster: keeping it"


def fit_terms(shape: ModelShape, card: Card, s: Setting, plan: Plan,
              action_s: dict[tuple[int, str], float]) -> tuple[float, float] | None:
    """(compute scale, host seconds per layer action) that best fit the measured medians of each stage's actions
    (least squares, neither negative); None when the measurements cannot separate them."""
    def costs(scale: float, host: float, links: bool) -> list:
        c = dataclasses.replace(card, compute_scale=scale, host_action_s=host)
        if not links:
            c = dataclasses.replace(c, allreduce_bytes_s=float("inf"), latency_s=0.0, mp_sync_s=0.0)
        return stage_costs(shape, c, s, plan)[0]

    # per action: its compute at the table's rate, its count of layer actions, and its MP collectives (the
    # link's time, not the compute's: taken off what is fitted)
    compute, count, whole = costs(1.0, 0.0, False), costs(0.0, 1.0, False), costs(1.0, 0.0, True)
    rows = [(getattr(compute[stage], kind), getattr(count[stage], kind),
             seconds - (getattr(whole[stage], kind) - getattr(compute[stage], kind)))
            for (stage, kind), seconds in action_s.items()
            if kind in KINDS and stage < len(compute) and getattr(compute[stage], kind) > 0]
    if len(rows) < 2:
        return None
    cc = sum(c * c for c, _, _ in rows)
    cn = sum(c * n for c, n, _ in rows)
    nn = sum(n * n for _, n, _ in rows)
    cy = sum(c * y for c, _, y in rows)
    ny = sum(n * y for _, n, y in rows)
    det = cc * nn - cn * cn
    scale, host = ((cy * nn - cn * ny) / det, (cc * ny - cn * cy) / det) if det > 1e-12 * cc * nn else (0.0, -1.0)
    if host < 0:  # the compute explains them alone
        scale, host = cy / cc, 0.0
    elif scale < MIN_SCALE:  # the host explains them: compute at its floor, the rest per layer action
        scale = MIN_SCALE
        host = max(0.0, (ny - scale * cn) / nn)
    return (scale, host) if scale > 0 else None


def link_rate(spans: list[tuple[str, int, float, float]], bucket_bytes: list[float], n: int) -> float | None:
    """The bus rate (bytes/s, as Card.allreduce_bytes_s counts it) the DP gradient collectives of one step reached:
    the bytes they moved per rank (an all-reduce 2 (n - 1) / n of its bucket, a reduce-scatter (n - 1) / n) over
    the time any of them was in flight, from launch to completion, overlaps counted once. None without them."""
    share = {"all_reduce": 2.0, "reduce_scatter": 1.0}
    moved = [(share[kind] * (n - 1) / n * bucket_bytes[b], start, end) for kind, b, start, end in spans
             if kind in share and 0 <= b < len(bucket_bytes) and end > start]
    if n < 2 or not moved:
        return None
    busy, reach = 0.0, float("-inf")
    for _, start, end in sorted(moved, key=lambda m: m[1]):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return sum(b for b, _, _ in moved) / (busy * 1e-6) if busy > 0 else None


def card_to_step(shape: ModelShape, card: Card, s: Setting, plan: Plan, measured_s: float) -> Card:
    """The card whose compute scale makes the plan's predicted step the measured one (bisection: the step grows
    with the scale). A step shorter than the table's fixed host work a step (a small model on a fast host) shows that
    guess wrong for this host: it is dropped before the scale is fitted."""
    def step(scale: float, c: Card) -> float:
        return predict(shape, dataclasses.replace(c, compute_scale=scale), s, plan).step_s

    low, high = 1e-3, 1e3
    if step(low, card) >= measured_s:
        card = dataclasses.replace(card, step_host_s=0.0)
    if step(low, card) >= measured_s:
        return dataclasses.replace(card, compute_scale=low)
    if step(high, card) <= measured_s:
        return dataclasses.replace(card, compute_scale=high)
    for _ in range(60):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if step(mid, card) < measured_s else (low, mid)
    return dataclasses.replace(card, compute_scale=(low * high) ** 0.5)


class Replanner:
    """The planner's inputs for a run, kept to predict every plan again under a refitted card."""

    def __init__(self, shape: ModelShape, setting: Setting, request: Request, legal: Callable[[Plan], bool],
                 choice: Choice):
        self.shape, self.setting, self.request, self.legal, self.choice = shape, setting, request, legal, choice

    @staticmethod
    def for_run(cfg, asked, grid, device_type: str, model_rules: Callable, choice: Choice) -> "Replanner":
        """cfg: the run's RunConfig; asked: its ScheduleConfig before the planner filled it."""
        from .run_plan import legality

        return Replanner(shape_of(cfg), Setting.of(cfg, grid.dp_size, grid.pp_size, grid.mp_size), Request.of(asked),
                         legality(cfg, grid.world_size, device_type, model_rules), choice)

    def refit(self, plan: Plan, measured_s: float, action_s: dict[tuple[int, str], float] | None = None,
              dp_rate: float | None = None) -> Refit:
        """plan: the running one; measured_s: its measured step; action_s: (stage, F|B|I|W) -> median seconds of
        that action, and dp_rate: the DP collectives' measured bus rate (link_rate), both with --trace."""
        shape, s, card = self.shape, self.setting, self.choice.card
        if dp_rate:
            card = dataclasses.replace(card, allreduce_bytes_s=dp_rate)
        terms = fit_terms(shape, card, s, plan, action_s) if action_s else None
        if terms is not None:
            card = dataclasses.replace(card, compute_scale=terms[0], host_action_s=terms[1])
        else:
            card = card_to_step(shape, card, s, plan, measured_s)
        ranked = choose(shape, card, s, self.request, self.legal, self.choice.cap).ranked
        placement = schedule_placement(plan.schedule)
        in_place = [p for p in ranked if p.plan.virtual_stages == plan.virtual_stages
                    and schedule_placement(p.plan.schedule) == placement]
        current = predict(shape, card, s, plan)
        return Refit(card, self.choice.card, current, min(in_place or [current], key=lambda p: p.step_s),
                     min(ranked, key=lambda p: p.step_s), measured_s)


def action_medians(spans: list[tuple[str, int, int, float, float]]) -> dict[tuple[int, str], float]:
    """(stage, kind) -> median seconds of the traced spans (metrics/trace.py's (type, stage, micro, start_us,
    end_us))."""
    by: dict[tuple[int, str], list[float]] = {}
    for kind, stage, _, start, end in spans:
        by.setdefault((stage, kind), []).append((end - start) * 1e-6)
    return {key: statistics.median(values) for key, values in by.items()}
