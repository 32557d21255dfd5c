"""Every grid of a world size (dp x pp x mp, the default order), each with its best plan, ranked by predicted step
time, with why each loser loses: the plan command's table (python -m hybrid_engine.plan, the driver's --plan-only).
The user's --dp/--pp/--mp stay the user's: this advises."""
from __future__ import annotations

import dataclasses
from typing import Callable

from hybrid_engine.config.engine import ConfigError

from .card import GIB, Card, this_device
from .choose import NoPlanFits, Prediction
from .model_shape import shape_of
from .run_plan import plan_for


def grids_of(world: int) -> list[tuple[int, int, int]]:
    """(dp, pp, mp) with dp x pp x mp = world."""
    return [(world // (pp * mp), pp, mp) for pp in range(1, world + 1) for mp in range(1, world + 1)
            if world % (pp * mp) == 0]


def why_slower(p: Prediction, best: Prediction, grid: tuple[int, int, int]) -> str:
    """The largest cost this grid pays that the best does not."""
    dp, pp, mp = grid
    t, b = p.time, best.time
    reasons = []
    if mp > 1:
        reasons.append((t.mp_exposed_s, f"mp{mp}: {t.mp_allreduces} all-reduces per step, "
                                        f"{t.mp_exposed_s * 1e3:.3g} ms exposed"))
    if pp > 1:
        reasons.append((t.bubble * t.pipeline_s, f"pp{pp}: bubble {t.bubble:.0%} of the pipeline"))
    if dp > 1:
        reasons.append((t.dp_exposed_s, f"dp{dp}: gradient collective {t.dp_exposed_s * 1e3:.3g} ms exposed"))
    reasons.append((t.update_s - b.update_s, f"update {t.update_s * 1e3:.3g} ms"))
    return max(reasons)[1] if reasons else ""


def rank_grids(cfg, world: int, card: Card, device_type: str, model_rules: Callable) -> list[tuple]:
    """[(grid, Prediction or None, note)], fastest first; a grid with no legal plan or none that fits last, its
    note saying why."""

    shape = shape_of(cfg)
    rows = []
    for dp, pp, mp in grids_of(world):
        c = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, dp=dp, pp=pp, mp=mp))
        try:
            grid = c.validate(world, device_type, model_rules)
            choice = plan_for(c, grid, card, device_type, model_rules, shape)
        except (ConfigError, NoPlanFits) as exc:
            rows.append(((dp, pp, mp), None, str(exc)))
            continue
        rows.append(((dp, pp, mp), choice.chosen, ""))
    ranked = sorted((r for r in rows if r[1] is not None), key=lambda r: r[1].step_s)
    if ranked:
        best = ranked[0][1]
        ranked = [ranked[0]] + [(g, p, why_slower(p, best, g)) for g, p, _ in ranked[1:]]
    return ranked + [r for r in rows if r[1] is None]


def grid_table(cfg, world: int, device_type: str, model_rules: Callable, card: Card | None = None) -> str:
    """The ranked table, one line per grid."""
    card = card or this_device(cfg.plan.card, device_type)
    shape = shape_of(cfg)
    cap = cfg.parallel.memory_cap_gib * GIB if cfg.parallel.memory_cap_gib is not None else card.memory_bytes
    head = (f"plans for {world} rank{'s' if world > 1 else ''} of {card.name} ({cap / GIB:.0f} GiB each), model "
            f"{shape.name}, batch {cfg.data.batch_size}" +
            ("" if card.search else "; the CPU keeps the plan nearest 1f1b x 4 micro-batches (--plan-card h100|h200 "
                                    "ranks by time)"))
    lines = [head, f"{'rank':>4}  {'grid':<14} {'plan':<46} {'ms/step':>9} {shape.unit:>12} {'GiB/GPU':>8}  why not"]
    for n, (grid, p, note) in enumerate(rank_grids(cfg, world, card, device_type, model_rules), 1):
        name = f"{grid[0]}x{grid[1]}x{grid[2]}"
        if p is None:
            lines.append(f"{'-':>4}  {name:<14} {'':<46} {'':>9} {'':>12} {'':>8}  {note}")
            continue
        rate = cfg.data.batch_size * shape.tokens_per_sample / p.step_s
        lines.append(f"{n:>4}  {name:<14} {p.plan.describe():<46} {p.step_s * 1e3:>9.3g} {rate:>12.4g} "
                     f"{p.peak / GIB:>8.1f}  {note}")
    lines.append("grid: dp x pp x mp (order mp-dp-pp); give the driver the first line's --dp, --pp, --mp and flags")
    return "\n".join(lines)
