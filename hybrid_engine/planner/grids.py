"""Every grid of a world size (dp x pp x mp, the default order, beside every cp size a token model's sequence
splits into: context.py cp_sizes), each with its best plan, ranked by predicted step time, with why each loser
loses: the plan command's table (python -m hybrid_engine.plan, the driver's --plan-only). The user's
--dp/--pp/--mp/--cp stay the user's: this advises."""
from __future__ import annotations

import dataclasses
import math
import shlex
from typing import Callable, Sequence

from hybrid_engine.config.checks import MAX_RANKS
from hybrid_engine.config.engine import ConfigError, DataParallelConfig

from .card import GIB, Card, this_device
from .choose import NoPlanFits, Prediction
from .context import cp_sizes
from .memory import usable_bytes
from .model_shape import shape_of
from .run_plan import plan_for, run_cap


def divisors(n: int) -> list[int]:
    """n's divisors, ascending, in O(sqrt n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def grids_of(world: int) -> list[tuple[int, int, int]]:
    """(dp, pp, mp) with dp x pp x mp = world, pp then mp ascending (from the divisors: a few hundred at most for
    MAX_RANKS, never world^2 pairs)."""
    return [(world // (pp * mp), pp, mp) for pp in divisors(world) for mp in divisors(world // pp)]


def zero_levels(cfg, dp: int, user_flags: Sequence[str]) -> tuple[int, ...]:
    """The ZeRO levels a dp-way grid is ranked under: the run's own where it fixes one (a flag, or a file's value
    other than the default), else every level the driver's --zero accepts (its field's choices); one DP rank
    shards nothing, so only the run's level."""
    fixed = any(a == "--zero" or a.startswith("--zero=") for a in user_flags)
    default = next(f.default for f in dataclasses.fields(DataParallelConfig) if f.name == "zero")
    if dp == 1 or fixed or cfg.data_parallel.zero != default:
        return (cfg.data_parallel.zero,)
    return ZERO_CHOICES


ZERO_CHOICES = tuple(next(f.metadata["choices"] for f in dataclasses.fields(DataParallelConfig) if f.name == "zero"))


def why_slower(p: Prediction, best: Prediction, grid: tuple[int, int, int], cp: int = 1) -> str:
    """How much slower than the first row, and the largest cost this plan pays that the best does not."""
    dp, pp, mp = grid
    t, b = p.time, best.time
    reasons = []
    if t.cp_comm is not None:
        reasons.append((t.cp_exposed_s, f"cp{cp}: {t.cp_comm.name} K/V {plain(t.cp_exposed_s * 1e3)} ms exposed"))
    if mp > 1:
        reasons.append((t.mp_exposed_s, f"mp{mp}: {t.mp_allreduces} all-reduces per step, "
                                        f"{plain(t.mp_exposed_s * 1e3)} ms exposed"))
    if pp > 1:
        reasons.append((t.bubble * t.pipeline_s, f"pp{pp}: bubble {t.bubble:.0%} of the pipeline "
                                                 f"({plain(t.bubble * t.pipeline_s * 1e3)} ms)"))
    if dp * cp > 1:
        replicas = f"dp{dp}" + (f" x cp{cp}" if cp > 1 else "")
        reasons.append((t.dp_exposed_s - b.dp_exposed_s,
                        f"{replicas}: gradient collective {plain(t.dp_exposed_s * 1e3)} ms exposed"))
    reasons.append((t.update_s - b.update_s, f"update {plain(t.update_s * 1e3)} ms"))
    gap = f"+{(p.step_s / best.step_s - 1) * 100:.0f}% ({plain(p.step_s * 1e3)} against {plain(best.step_s * 1e3)} ms)"
    return f"{gap}: {max(reasons)[1]}"


def rank_grids(cfg, world: int, card: Card, device_type: str, model_rules: Callable,
               user_flags: Sequence[str] = ()) -> list[tuple]:
    """[(grid, cp, zero, Prediction or None, note, the least plan that did not fit or None)], fastest first, every
    grid beside every cp size ranked (context.py cp_sizes) under every ZeRO level it is ranked under; a grid with no
    legal plan or none that fits last, its note saying why in numbers."""
    rows = []
    sizes = cp_sizes(cfg, world, user_flags)
    if world % sizes[0]:  # a cp the run fixes
        raise ConfigError(f"world size {world} is not divisible by --cp {sizes[0]}")
    for cp in sizes:
        # each once some grid passes the run's checks (a shape the checks refuse is said in their words), per mp and
        # ZeRO level: the kernels a run gets there (models/planner_shape.planned_kernels: the elementwise fusions
        # under tensor parallelism, fp8's weight cache under ZeRO-3)
        shapes = {}
        for dp, pp, mp in grids_of(world // cp):
            for zero in zero_levels(cfg, dp * cp, user_flags):
                c = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, dp=dp, pp=pp, mp=mp, cp=cp),
                                        data_parallel=dataclasses.replace(cfg.data_parallel, zero=zero))
                try:
                    grid = c.validate(world, device_type, model_rules)
                    shape = shapes[mp, zero] = shapes.get((mp, zero)) or shape_of(c)
                    choice = plan_for(c, grid, card, device_type, model_rules, shape)
                except (ConfigError, NoPlanFits) as exc:
                    rows.append(((dp, pp, mp), cp, zero, None, str(exc), getattr(exc, "least", None)))
                    continue
                rows.append(((dp, pp, mp), cp, zero, choice.chosen, "", None))
    if all(r[3] is None for r in rows) and len({r[4] for r in rows}) == 1:
        raise ConfigError(rows[0][4])  # every grid refused alike: the input's mistake, not a grid's
    ranked = sorted((r for r in rows if r[3] is not None), key=lambda r: r[3].step_s)
    if ranked:
        best = ranked[0][3]
        ranked = [ranked[0]] + [(g, cp, z, p, why_slower(p, best, g, cp), None) for g, cp, z, p, _, _ in ranked[1:]]
    return ranked + [r for r in rows if r[3] is None]


def cp_verdicts(rows, sizes: tuple[int, ...]) -> list[str]:
    """Why each cp size was or was not picked, one line each (rows: the plan command's, (grid, cp, zero,
    Prediction or None, note, the least plan that did not fit or None), fastest first): its best row's memory
    per rank -- the activations and temporaries, 1 / cp of a sequence's -- and the K/V time its transfers expose
    a step; or the least memory any of its grids needs."""
    lines = []
    for cp in sizes:
        mine = [(n, r) for n, r in enumerate(rows, 1) if r[1] == cp]
        best = next(((n, r[3], r[0]) for n, r in mine if r[3] is not None), None)
        if best is not None:
            n, p, grid = best
            line = (f"cp {cp}: row {n} ({'x'.join(map(str, grid))}), {plain(p.peak / GIB)} GiB a rank, of which "
                    f"{plain(max(r.dynamic for r in p.ranks) / GIB)} activations and temporaries")
            if p.time.cp_comm is not None:
                kv = p.time.cp_comm
                line += (f"; {kv.name} K/V {plain(p.time.cp_exposed_s * 1e3)} ms a step exposed "
                         f"({plain(kv.cost.exposed_s * 1e3)} ms a layer and micro-batch, the "
                         f"{'all-gather' if kv.name == 'ring' else 'ring'}'s "
                         f"{plain((kv.all_gather if kv.name == 'ring' else kv.ring).exposed_s * 1e3)})")
            lines.append(line)
            continue
        least = [r[5] for _, r in mine if r[5] is not None]
        if least:
            need = min(least, key=lambda p: p.needed)
            lines.append(f"cp {cp}: no grid fits; the least any needs is {plain(need.peak / GIB)} GiB a rank "
                         f"({plain(need.needed / GIB)} with the allocator's overhead)")
        elif mine:
            lines.append(f"cp {cp}: no grid runs: {mine[0][1][4]}")
    return lines


def plain(x: float) -> str:
    """x to 3 significant figures in plain digits, never an exponent (1290, 5.97, 0.0123): every number of the
    table in one form."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def winner_command(world: int, grid: tuple[int, int, int], zero: int, p: Prediction,
                   user_flags: Sequence[str], cp: int = 1) -> str:
    """The driver's command line that runs the first row: its grid (with --cp when it splits sequences), ZeRO
    level and plan, and the user's other flags."""
    kept = without_flags(user_flags, DECIDED_FLAGS)
    launch = f"torchrun --nproc_per_node={world} hybrid_engine.py" if world > 1 else "python hybrid_engine.py"
    sizes = f"--dp {grid[0]}" + (f" --cp {cp}" if cp > 1 else "") + f" --pp {grid[1]} --mp {grid[2]} --zero {zero}"
    return " ".join([launch, sizes, p.plan.flags(), *map(shlex.quote, kept)])


# flag -> whether it takes a value: what the table decides (the grid, the plan) and the commands' own, left out of
# the winner's command line
DECIDED_FLAGS = {"--dp": True, "--pp": True, "--mp": True, "--schedule": True, "--micro-batches": True,
                 "--virtual-stages": True, "--lookahead": True, "--merge-wgrad": False, "--no-merge-wgrad": False,
                 "--plan-only": False, "--no-plan-only": False, "--world-size": True, "--calibrate": False,
                 "--zero": True, "--cp": True}


def without_flags(argv: Sequence[str], dropped: dict[str, bool]) -> list[str]:
    """argv without the flags of `dropped` (flag -> whether it takes a value) and their values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in dropped:
            skip = dropped[name] and "=" not in arg
            continue
        out.append(arg)
    return out


def grid_table(cfg, world: int, device_type: str, model_rules: Callable, card: Card | None = None,
               user_flags: Sequence[str] = ()) -> str:
    """The ranked table, one line per grid and ZeRO level, then the first row's command line (user_flags: the
    flags the table was asked with, which it keeps). A GPU card is planned for as a GPU from any machine (its
    memory, fp16 allowed). A world beyond MAX_RANKS, or a mistake every grid finds alike, is one ConfigError."""
    if not 1 <= world <= MAX_RANKS:
        raise ConfigError(f"the world size to plan for must be a number of ranks in [1, {MAX_RANKS}], got {world}")
    card = card or this_device(cfg.plan.card, device_type)
    if card.search:  # a card the cost model times is a GPU's, wherever the table is asked for
        device_type = "cuda"
    rows = rank_grids(cfg, world, card, device_type, model_rules, user_flags)
    shape = shape_of(dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, cp=1)))  # whole sequences
    cap = run_cap(cfg, card)
    per = "GPU" if device_type == "cuda" else "rank"
    head = (f"plans for {world} rank{'s' if world > 1 else ''} of {card.name} ({plain(cap / GIB)} GiB each, a plan "
            f"may need {plain(usable_bytes(cap) / GIB)} with the allocator's overhead), model {shape.name}, batch "
            f"{cfg.data.batch_size}" +
            ("" if card.search else "; the CPU keeps the plan nearest 1f1b x 4 micro-batches (--plan-card h100|h200 "
                                    "ranks by time)"))
    lines = [head, f"{'rank':>4}  {'grid':<9} {'zero':>4} {'cp':>3}  {'plan':<46} {'ms/step':>9} {shape.unit:>12} "
                   f"{'GiB/' + per:>8}  why not"]
    for n, (grid, cp, zero, p, note, _) in enumerate(rows, 1):
        name = f"{grid[0]}x{grid[1]}x{grid[2]}"
        if p is None:
            lines.append(f"{'-':>4}  {name:<9} {zero:>4} {cp:>3}  {'':<46} {'':>9} {'':>12} {'':>8}  {note}")
            continue
        rate = cfg.data.batch_size * shape.tokens_per_sample / p.step_s
        lines.append(f"{n:>4}  {name:<9} {zero:>4} {cp:>3}  {p.plan.describe():<46} {plain(p.step_s * 1e3):>9} "
                     f"{plain(rate):>12} {p.peak / GIB:>8.1f}  {note}")
    lines.append("grid: dp x pp x mp (order mp-dp-pp); zero: --zero; cp: --cp, each sequence split over cp ranks; "
                 "GiB: the predicted allocated peak")
    sizes = sorted({r[1] for r in rows})
    if len(sizes) > 1:
        lines += cp_verdicts(rows, tuple(sizes))
    first = rows[0]
    if first[3] is not None:
        lines.append(f"run the first: {winner_command(world, first[0], first[2], first[3], user_flags, first[1])}")
    return "\n".join(lines)
