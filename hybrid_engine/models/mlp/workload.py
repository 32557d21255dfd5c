"""The course MLP as a workload: its model, loss, data and cut, from the run's configuration; its rules; and its
shape as the planner sees it."""
from __future__ import annotations

import torch

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models import losses
from hybrid_engine.models.planner_shape import LayerShape, ModelShape
from hybrid_engine.models.workload import Workload
from hybrid_engine.parallel.tensor.layers import parallelize_mlp

from .data import SyntheticRegression
from .model import large_linear_model


LOSS = losses.MSE()  # the MLP's loss, built in: the workload's, and the planner's shape says so
CHECKPOINT_NAME = "large_linear_model"  # the MLP's name in a checkpoint's manifest, which every checkpoint keeps


def mlp_workload(dim: int, depth: int, seed: int, device: torch.device | str = "cpu") -> Workload:
    """The course MLP: depth x (Linear(dim, dim) + ReLU) against SyntheticRegression, built-in MSE, cut by layer
    count, split by parallelize_mlp."""
    model = large_linear_model(dim, depth, seed)
    names = [f"{kind} {block}" for block in range(depth) for kind in ("linear", "relu")]  # blocks from 0, as the GPT's
    costs = [1.0 if any(True for _ in m.parameters()) else 0.0 for m in model]
    return Workload(
        name="mlp", model=model, loss=LOSS, parallelize=parallelize_mlp, layout_fn=None,
        data=SyntheticRegression(dim, seed, device), flops_per_sample=6.0 * dim * dim * depth, tokens_per_sample=1,
        checkpoint_model={"name": CHECKPOINT_NAME, "dim": dim, "depth": depth, "seed": seed},
        summary=f"model: MLP, {depth} x Linear({dim}, {dim}) + ReLU, synthetic regression (seed {seed})",
        layer_names=names, layer_costs=costs)


def build(cfg, device: torch.device | str = "cpu") -> Workload:
    """The workload of a run (cfg: RunConfig whose [model] is the MLP)."""
    m = cfg.model.options
    return mlp_workload(m.dim, m.depth, cfg.model.seed, device)


def check(cfg, grid, device_type: str) -> None:
    """The MLP's rules on this grid, before any collective: every stage holds a layer, MP splits every width."""
    m, s = cfg.model.options, cfg.schedule
    stages = grid.pp_size * s.chunks
    if m.depth < stages:
        raise ConfigError(f"--depth {m.depth} is less than pp x virtual stages = {grid.pp_size} x {s.chunks} "
                          f"= {stages}: every stage needs at least one layer")
    if m.dim % grid.mp_size != 0:
        raise ConfigError(f"--dim {m.dim} is not divisible by --mp {grid.mp_size}")
    if cfg.data.path is not None:
        raise ConfigError("--data applies to --model gpt and llama only (the MLP trains on synthetic regression)")
    if cfg.stages.recompute == "selective":
        raise ConfigError("--recompute selective applies to --model gpt and llama only (it recomputes the attention core); "
                          "the MLP recomputes whole stages: --recompute full")
    if cfg.stages.split_blocks == "on":
        raise ConfigError("--split-blocks on applies to --model gpt and llama only (stages end between a block's "
                          "attention and MLP halves); the MLP's stages hold whole layers")
    if cfg.training.eval_every:
        raise ConfigError("--eval-every applies to --model gpt and llama only (the MLP's data has no held-out part)")


def mlp_shape(dim: int, depth: int) -> ModelShape:
    """The course MLP: one layer per Linear + ReLU block; the native chain keeps each layer's output; MP splits
    column-row pairs, one all-reduce per pair."""
    from hybrid_engine.parallel.pipeline.partition import stage_block_counts

    def cut(stages: int, pp: int | None = None, placement: str = "loop") -> list[list[int]]:  # whole layers
        out, start = [], 0
        for count in stage_block_counts(depth, stages):
            out.append(list(range(start, start + count)))
            start += count
        return out

    layer = LayerShape(params=dim * dim + dim, matmul_params=dim * dim, act_split=dim, stash=2 * dim,
                       mp_allreduces=0.5, loss_bytes=0.0)
    return ModelShape("mlp", (layer,) * depth, dim, 1, data_bytes=2 * dim, flops_per_sample=6.0 * dim * dim * depth,
                      native=True, builtin_loss=losses.is_builtin(LOSS), cut=cut)


def shape(cfg) -> ModelShape:
    """The planner's view of a run of the MLP (cfg: RunConfig)."""
    return mlp_shape(cfg.model.options.dim, cfg.model.options.depth)
