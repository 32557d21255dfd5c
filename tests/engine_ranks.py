"""Rank-side helpers for engine tests (module level, so spawned ranks can import them)."""
from __future__ import annotations

import torch.distributed as dist

from engine_builders import NonfiniteGradAt, make_engine
from hybrid_engine._C.schedule import splits_backward
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model


def train_on_grid(rank: int, world: int, dp: int, pp: int, mp: int, schedule: str, v: int, cfg: dict) -> dict:
    """Train cfg['steps'] steps on one grid; returns losses and (on dp rank 0) this rank's full layers."""
    grid = ProcessGrid(dp, pp, mp)
    groups = build_groups(grid, rank)
    model = large_linear_model(cfg["dim"], cfg["depth"], cfg.get("seed", 0))
    engine = make_engine(model, groups, schedule=schedule, micro_batches=cfg["micro_batches"],
                         virtual_stages=v, optimizer=cfg.get("optimizer", "sgd"), lr=cfg["lr"],
                         merge_weight_grads=cfg.get("merge_weight_grads", False) and splits_backward(schedule),
                         lookahead=cfg.get("lookahead", 0), stage_impl=cfg.get("stage_impl", "auto"),
                         recompute=cfg.get("recompute", False), zero=cfg.get("zero", 0))
    data = SyntheticRegression(cfg["dim"], cfg.get("seed", 0), "cpu")
    per_dp = cfg["batch_size"] // dp
    d = groups.coords.dp
    losses = []
    for step in range(cfg["steps"]):
        x, y = data.batch(step, cfg["batch_size"], d * per_dp, (d + 1) * per_dp)
        losses.append(engine.train_step(x, y).loss)
    # numpy, not tensors: torch would pass tensors through shared memory that dies with this process
    state = {k: v.numpy() for k, v in engine.full_state_dict().items()}
    engine.close()
    groups.destroy()
    return {"losses": losses, "state": state if d == 0 and groups.coords.mp == 0 else {}}


def sweep(rank: int, world: int, runs: list[tuple], cfg: dict) -> list[dict]:
    """Several grids of the same world size, one after another in the same processes."""
    out = []
    for dp, pp, mp, schedule, v in runs:
        out.append(train_on_grid(rank, world, dp, pp, mp, schedule, v, cfg))
        dist.barrier()
    return out


def amp_overflow_run(rank: int, world: int, dp: int, pp: int, mp: int, cfg: dict, inject_rank: int,
                     inject_step: int) -> dict:
    """fp16 half-weights training where one rank finds an inf in its gradients at one step."""
    grid = ProcessGrid(dp, pp, mp)
    groups = build_groups(grid, rank)
    engine = make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups, schedule="1f1b",
                         micro_batches=cfg["micro_batches"], lr=cfg["lr"], amp="fp16", impl="half-weights",
                         scale_window=cfg.get("scale_window", 2000))
    if rank == inject_rank:
        engine.add_post_backward_hook(NonfiniteGradAt({inject_step}))
    data = SyntheticRegression(cfg["dim"], 0, "cpu")
    per_dp = cfg["batch_size"] // dp
    d = groups.coords.dp
    history, states = [], {}
    for step in range(cfg["steps"]):
        x, y = data.batch(step, cfg["batch_size"])
        if step == inject_step:
            states["before"] = {k: v.numpy() for k, v in engine.full_state_dict().items()}
        result = engine.train_step(x[d * per_dp:(d + 1) * per_dp], y[d * per_dp:(d + 1) * per_dp])
        history.append((result.loss_scale, result.skipped, engine.scaler.scale))
        if step == inject_step:
            states["after"] = {k: v.numpy() for k, v in engine.full_state_dict().items()}
    engine.close()
    groups.destroy()
    return {"history": history, "states": states}


def train_precision(rank: int, world: int, runs: list[tuple], cfg: dict, amp: str, impl: str) -> list[list[float]]:
    """Loss curves of several grids (dp, pp, mp, schedule) in one precision."""
    curves = []
    for dp, pp, mp, schedule in runs:
        grid = ProcessGrid(dp, pp, mp)
        groups = build_groups(grid, rank)
        engine = make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups, schedule=schedule,
                             micro_batches=cfg["micro_batches"], lr=cfg["lr"], amp=amp, impl=impl)
        data = SyntheticRegression(cfg["dim"], 0, "cpu")
        per_dp = cfg["batch_size"] // dp
        d = groups.coords.dp
        losses = []
        for step in range(cfg["steps"]):
            x, y = data.batch(step, cfg["batch_size"])
            losses.append(engine.train_step(x[d * per_dp:(d + 1) * per_dp], y[d * per_dp:(d + 1) * per_dp]).loss)
        engine.close()
        groups.destroy()
        dist.barrier()
        curves.append(losses)
    return curves


def fp16_sgd_paths(rank: int, world: int, dp: int, pp: int, mp: int, cfg: dict, inject_rank: int, inject_step: int,
                   loss_scale: float | None, scale_window: int) -> dict:
    """fp16 half-weights plain-SGD training twice on the same grid and data: "fused" (the default: overflow check
    that only reads, 1/scale and the skip applied inside the fused SGD step) and "unscaled" (clip_grad far
    above any norm: unscale_and_check unscales in place, the clip only measures and leaves the gradients alone,
    then the plain fused step: the path every fp16 step took before the fold). Per path: per step (loss,
    skipped, loss scale used, grad_norm, scale after), this rank's weights (full masters, own half weights) around
    the inject step and at the end, and its gradient buckets after the last step."""
    out = {}
    for path, clip_grad in (("fused", 0.0), ("unscaled", 1e30)):
        grid = ProcessGrid(dp, pp, mp)
        groups = build_groups(grid, rank)
        engine = make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups, schedule="1f1b",
                             micro_batches=cfg["micro_batches"], lr=cfg["lr"], amp="fp16", impl="half-weights",
                             loss_scale=loss_scale, scale_window=scale_window, clip_grad=clip_grad)
        if rank == inject_rank:
            engine.add_post_backward_hook(NonfiniteGradAt({inject_step}))
        data = SyntheticRegression(cfg["dim"], 0, "cpu")
        per_dp = cfg["batch_size"] // dp
        d = groups.coords.dp

        def weights() -> dict:  # the fp32 masters (gathered) and this rank's own half weights
            halves = {f"half.{i}": p.detach().float().numpy() for i, p in enumerate(engine.parameters)}
            return {**{k: v.numpy() for k, v in engine.full_state_dict().items()}, **halves}

        history, states = [], {}
        for step in range(cfg["steps"]):
            x, y = data.batch(step, cfg["batch_size"])
            if step == inject_step:
                states["before"] = weights()
            r = engine.train_step(x[d * per_dp:(d + 1) * per_dp], y[d * per_dp:(d + 1) * per_dp])
            history.append((r.loss, r.skipped, r.loss_scale, r.grad_norm, engine.scaler.scale))
            if step == inject_step:
                states["after"] = weights()
        states["final"] = weights()
        out[path] = {"history": history, "states": states,
                     "buckets": [b.clone().numpy() for b in engine.grads.buckets]}
        engine.close()
        groups.destroy()
        dist.barrier()
    return out
