"""Rank-side helpers for checkpoint tests (module level, so spawned ranks can import them)."""
from __future__ import annotations

import torch.distributed as dist

from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine import checkpoint
from hybrid_engine.engine.engine import Engine
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model


def _engine(rank: int, grid: tuple[int, int, int], cfg: dict) -> Engine:
    groups = build_groups(ProcessGrid(*grid), rank)
    model = large_linear_model(cfg["dim"], cfg["depth"], cfg.get("seed", 0))
    return make_engine(model, groups, schedule=cfg.get("schedule", "1f1b"), micro_batches=cfg["micro_batches"],
                       optimizer=cfg["optimizer"], lr=cfg["lr"])


def run_info(cfg: dict) -> dict:
    return {"model": {"name": "large_linear_model", "dim": cfg["dim"], "depth": cfg["depth"],
                      "seed": cfg.get("seed", 0)}, "optimizer": cfg["optimizer"]}


def _train(engine: Engine, first: int, last: int, cfg: dict) -> list[float]:
    data = SyntheticRegression(cfg["dim"], cfg.get("seed", 0), "cpu")
    per_dp = cfg["batch_size"] // engine.dp_size
    d = engine.groups.coords.dp
    losses = []
    for step in range(first, last):
        x, y = data.batch(step, cfg["batch_size"])
        losses.append(engine.train_step(x[d * per_dp:(d + 1) * per_dp], y[d * per_dp:(d + 1) * per_dp]).loss)
    return losses


def _finish(engine: Engine) -> None:
    engine.close()
    engine.groups.destroy()


def straight_then_resumed(rank: int, world: int, grid: tuple, cfg: dict, root: str, split: int) -> dict:
    """cfg['steps'] steps in one go; then `split` steps, save, a fresh engine loads and does the rest."""
    engine = _engine(rank, grid, cfg)
    straight = _train(engine, 0, cfg["steps"], cfg)
    _finish(engine)

    engine = _engine(rank, grid, cfg)
    first = _train(engine, 0, split, cfg)
    checkpoint.save(engine, root, split, run_info(cfg))
    _finish(engine)
    dist.barrier()
    engine = _engine(rank, grid, cfg)  # a new engine: nothing survives but what is on disk
    start = checkpoint.load(engine, checkpoint.open_checkpoint(root))
    second = _train(engine, start, cfg["steps"], cfg)
    _finish(engine)
    return {"straight": straight, "resumed": first + second, "start": start}


def train_segment(rank: int, world: int, grid: tuple, cfg: dict, load: str | None, save: str | None,
                  last: int, keep: int = 3) -> list[float]:
    """Load `load` (if given), train up to step `last`, save under `save` (if given)."""
    engine = _engine(rank, grid, cfg)
    first = checkpoint.load(engine, checkpoint.open_checkpoint(load)) if load else 0
    losses = _train(engine, first, last, cfg)
    if save:
        checkpoint.save(engine, save, last, run_info(cfg), keep=keep)
    _finish(engine)
    return losses


def save_every_step(rank: int, world: int, grid: tuple, cfg: dict, root: str, steps: int, keep: int) -> None:
    engine = _engine(rank, grid, cfg)
    for step in range(steps):
        _train(engine, step, step + 1, cfg)
        checkpoint.save(engine, root, step + 1, run_info(cfg), keep=keep)
    _finish(engine)


def try_load(rank: int, world: int, grid: tuple, cfg: dict, path: str) -> str:
    """The CheckpointError message this rank gets (every rank must get one, none may hang)."""
    engine = _engine(rank, grid, cfg)
    try:
        checkpoint.load(engine, checkpoint.open_checkpoint(path))
        return "loaded"
    except checkpoint.CheckpointError as exc:
        return str(exc)
    finally:
        _finish(engine)
