"""A model's shape as one context-parallel rank sees it: each sample is cut over the cp ranks, so a rank computes
and keeps 1 / cp of every sample's tokens (their attention still spans the whole sequence: a token's attention
FLOPs are unchanged), and its activation memory is the sequence's / cp -- what lets a 128k-token sequence fit.
Also which cp sizes the plan command ranks (grids.py says why each was or was not picked), and the driver's hint
of the cp that fits when nothing else does (the driver never picks a cp itself)."""
from __future__ import annotations

import dataclasses

from hybrid_engine.models.planner_shape import ModelShape

__all__ = ["context_hint", "cp_sizes", "per_context_rank"]


def per_context_rank(shape: ModelShape, cp: int) -> ModelShape:
    """`shape` with a sample's tokens, data and FLOPs those of one of cp ranks."""
    if cp == 1:
        return shape
    return dataclasses.replace(shape, tokens_per_sample=shape.tokens_per_sample // cp,
                               data_bytes=shape.data_bytes / cp, flops_per_sample=shape.flops_per_sample / cp)


def context_hint(cfg, grid, plan_for, *args) -> str:
    """When no plan fits a token model on this grid: '; --cp N fits ...', the smallest cp (the same world, dp
    giving way) whose plan fits, said with its price -- the K/V time its transfers expose a step -- and the reason --
    each rank keeps 1 / N of a sequence's activations; '' when cp is already asked for, the model has no sequences,
    or no cp fits either. plan_for(cfg, grid, *args): the planner's (run_plan.py)."""
    from hybrid_engine.config.checks import resolve_grid
    from hybrid_engine.config.engine import ConfigError

    seq_len, p = getattr(cfg.model.options, "seq_len", None), cfg.parallel
    if seq_len is None or p.cp > 1:
        return ""
    others = grid.pp_size * grid.mp_size
    for cp in (2, 4, 8, 16, 32):
        if grid.world_size % (cp * others) or seq_len % (2 * cp):
            continue
        trial = dataclasses.replace(cfg, parallel=dataclasses.replace(p, cp=cp, dp=None))
        try:
            chosen = plan_for(trial, resolve_grid(None, p.pp, p.mp, p.order, grid.world_size, cp=cp), *args).chosen
        except (ConfigError, ValueError):  # NoPlanFits is a ValueError
            continue
        kv = chosen.time
        cost = (f"; under --cp {cp} its {kv.cp_comm.name} K/V transfers expose {kv.cp_exposed_s * 1e3:.1f} ms a step"
                if kv.cp_comm is not None else "")
        return (f"{cost}; --cp {cp} fits: each rank then keeps 1/{cp} of a sequence's activations "
                f"({chosen.peak / 2**30:.1f} GiB predicted)")
    return ""


def cp_sizes(cfg, world: int, user_flags) -> tuple[int, ...]:
    """The cp sizes the plan command ranks: the run's own where it fixes one (--cp, or a file's value other than
    1); for a token model every power of two dividing the world whose 2 cp chunks divide the sequence; else 1."""
    seq_len = getattr(cfg.model.options, "seq_len", None)
    fixed = any(a == "--cp" or a.startswith("--cp=") for a in user_flags) or cfg.parallel.cp != 1
    if fixed or seq_len is None:
        return (cfg.parallel.cp,)
    sizes, cp = [1], 2
    while world % cp == 0:
        if seq_len % (2 * cp) == 0:
            sizes.append(cp)
        cp *= 2
    return tuple(sizes)

