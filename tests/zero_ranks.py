"""Rank-side helpers for the ZeRO 2/3 tests (module level, so spawned ranks can import them)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model


def _engine(groups, run: dict, cfg: dict):
    return make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups, schedule=run.get("schedule", "1f1b"),
                       micro_batches=cfg["micro_batches"], virtual_stages=run.get("v", 1), lr=cfg["lr"],
                       optimizer=run.get("optimizer", "sgd"), zero=run["zero"], dp_bucket_mb=cfg["bucket_mb"],
                       recompute=run.get("recompute", False), stage_impl=run.get("stage_impl", "auto"),
                       merge_weight_grads=run.get("merge", False), clip_grad=run.get("clip", 0.0),
                       shard_size=run.get("shard_size", 0), prefetch=run.get("prefetch", 1),
                       trace=run.get("trace", False))


def _rows(groups, dp: int, step: int, cfg: dict):
    x, y = SyntheticRegression(cfg["dim"], 0, "cpu").batch(step, cfg["batch_size"])
    d, per = groups.coords.dp, cfg["batch_size"] // dp
    return x[d * per:(d + 1) * per], y[d * per:(d + 1) * per]


def _numpy(state: dict) -> dict:
    # numpy, not tensors: torch would pass tensors through shared memory that dies with this process
    return {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in state.items()}


def train_runs(rank: int, world: int, runs: list[dict], cfg: dict) -> list[dict]:
    """Each run: {dp, pp, mp, zero, schedule, v, ...}; losses, norms, the full state (on dp/mp rank 0), the held
    (parameter, gradient) bytes once the backward is over and after the step, and the trace's DP collectives."""
    out = []
    for run in runs:
        dp = run["dp"]
        groups = build_groups(ProcessGrid(dp, run.get("pp", 1), run.get("mp", 1)), rank)
        engine = _engine(groups, run, cfg)
        held = {}
        if engine.zero is not None:
            engine.add_post_backward_hook(lambda e: held.setdefault("after_backward", e.zero.held_bytes()))
        if engine.zero is not None and engine.zero.level >= 2:
            # as each layer starts its forward (engine._stages: `stages` would gather): the most parameter bytes
            # held, and the (parameter, gradient) bytes held as the step's first layer starts
            def watch(module, args, zero=engine.zero):
                held["in_forward"] = max(held.get("in_forward", 0), zero.held_bytes()[0])
                held.setdefault("step_start", zero.held_bytes())
            for stage in engine._stages.values():
                for layer in stage:
                    layer.register_forward_pre_hook(watch)
        losses, norms = [], []
        for step in range(cfg["steps"]):
            held.pop("step_start", None)
            result = engine.train_step(*_rows(groups, dp, step, cfg))
            losses.append(result.loss)
            norms.append(result.grad_norm)
        if engine.zero is not None:
            held["after_step"] = engine.zero.held_bytes()
        comm = [(c.kind, c.bucket, c.start_us, c.end_us) for c in engine.comm_trace] if run.get("trace") else []
        whole = (sum(p.numel() * p.element_size() for p in engine.parameters),
                 sum(b.numel() * b.element_size() for b in engine.grads.buckets))
        state = _numpy(engine.full_state_dict())
        evaluated = engine.evaluate(*_rows(groups, dp, 0, cfg)) if run.get("evaluate") else None
        keep = groups.coords.dp == 0 and groups.coords.mp == 0
        out.append({"losses": losses, "norms": norms, "state": state if keep else {}, "held": held, "whole": whole,
                    "buckets": len(engine.grads.buckets), "comm": comm,
                    "evaluated": evaluated})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


def save_runs(rank: int, world: int, runs: list[dict], cfg: dict, first: int) -> list[dict]:
    """Each run trained `first` steps, its checkpoint state returned (numpy), and the straight run's losses."""
    out = []
    for run in runs:
        groups = build_groups(ProcessGrid(run["dp"], run.get("pp", 1), run.get("mp", 1)), rank)
        engine = _engine(groups, run, cfg)
        losses = [engine.train_step(*_rows(groups, run["dp"], step, cfg)).loss for step in range(cfg["steps"])]
        engine.close()
        engine = _engine(groups, run, cfg)
        for step in range(first):
            engine.train_step(*_rows(groups, run["dp"], step, cfg))
        state = engine.state_for_checkpoint()
        out.append({"losses": losses, "weights": _numpy(state["weights"]),
                    "optimizer": {k: _numpy(d) for k, d in state["optimizer"].items()}})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


def resume_runs(rank: int, world: int, runs: list[dict], saved: list[dict], cfg: dict, first: int) -> list[list]:
    """Each run loads the matching saved state (gathered from every rank of the saving run) and trains on."""
    out = []
    for run, state in zip(runs, saved):
        groups = build_groups(ProcessGrid(run["dp"], run.get("pp", 1), run.get("mp", 1)), rank)
        engine = _engine(groups, run, cfg)
        weights = {k: torch.from_numpy(v) for k, v in state["weights"].items()}
        optimizer = {k: {kk: torch.from_numpy(vv) if hasattr(vv, "shape") else vv for kk, vv in d.items()}
                     for k, d in state["optimizer"].items()}
        engine.load_checkpoint_state(weights, optimizer, None)
        out.append([engine.train_step(*_rows(groups, run["dp"], step, cfg)).loss
                    for step in range(first, cfg["steps"])])
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


def overflow_runs(rank: int, world: int, levels: list[int], cfg: dict, inject_rank: int, inject_step: int) -> list:
    """fp16 half weights at each ZeRO level on dp2: one rank finds an inf in its own shard of the summed gradients
    at one step. Per level: (skipped, loss scale, weights unchanged) per step."""
    out = []
    for level in levels:
        groups = build_groups(ProcessGrid(2, 1, 1), rank)
        engine = make_engine(large_linear_model(cfg["dim"], cfg["depth"], 0), groups,
                             micro_batches=cfg["micro_batches"], lr=cfg["lr"], amp="fp16", zero=level,
                             dp_bucket_mb=cfg["bucket_mb"], optimizer="adam", stage_impl="autograd")
        steps = {"n": 0}

        def poison(e) -> None:
            if rank == inject_rank and steps["n"] == inject_step:
                e.zero.grad_shards[0].view(-1)[0] = float("inf")
            steps["n"] += 1

        engine.add_post_backward_hook(poison)
        history = []
        for step in range(cfg["steps"]):
            before = {k: v.clone() for k, v in engine.full_state_dict().items()}
            result = engine.train_step(*_rows(groups, 2, step, cfg))
            after = engine.full_state_dict()
            history.append((result.skipped, result.loss_scale, all(torch.equal(before[k], after[k]) for k in before)))
        out.append(history)
        engine.close()
        groups.destroy()
        dist.barrier()
    return out
