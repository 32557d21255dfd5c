"""A fourth model, from outside the engine: everything it needs is here, and one line registers it

    from hybrid_engine.models import register
    register("tiny", ENTRY)

after which `--model tiny` trains it on any grid (tests/tiny_model_driver.py is the driver with that line). The
model is `blocks` x [Linear(width, 2 width) + Tanh + Linear(2 width, width)], fit by MSE to sin of its input; its
weights and data come from the seed stream the registry gives it, its tensor-parallel plan is the engine's
parallelize_mlp (each block one column-row pair), its stages are whole blocks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models import ModelEntry, losses, registry, stream_seed
from hybrid_engine.models.planner_shape import LayerShape, ModelShape
from hybrid_engine.models.workload import Workload
from hybrid_engine.parallel.pipeline.partition import stage_block_counts
from hybrid_engine.parallel.tensor.layers import parallelize_mlp

DATA_INDEX = 1 << 20  # a data row's index in the model's stream starts here, past every layer's


@dataclass(frozen=True)
class TinyOptions:
    """The tiny model: blocks x [Linear(width, 2 width) + Tanh + Linear(2 width, width)] against sin(x)."""

    OPTIMIZER: ClassVar[tuple[str, float]] = ("adam", 0.01)

    width: int = 8
    """Tiny: features in and out of every block."""
    blocks: int = 2
    """Tiny: number of blocks."""

    def check(self) -> None:
        if self.width < 1 or self.blocks < 1:
            raise ConfigError(f"--width and --blocks must be >= 1, got {self.width} and {self.blocks}")


class StreamLinear(nn.Linear):
    """nn.Linear drawing its initial weights from (seed, stream, index) on its own device."""

    def __init__(self, dim_in: int, dim_out: int, seed: int, stream: int, index: int):
        self.init_seed = stream_seed(seed, stream, index)
        super().__init__(dim_in, dim_out, device="meta")

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        gen = torch.Generator(device=self.weight.device).manual_seed(self.init_seed)
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound, generator=gen)
            self.bias.uniform_(-bound, bound, generator=gen)


class SineData:
    """Row r of step t: x ~ N(0, 1) from its own generator (seed, stream, t, r), target sin(x): any row range is
    the same numbers on every grid."""

    def __init__(self, width: int, seed: int, stream: int):
        self.width, self.seed, self.stream = width, seed, stream

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             dtype: torch.dtype = torch.float32):
        rows = []
        for r in range(start, stop):
            gen = torch.Generator().manual_seed(stream_seed(self.seed, self.stream, DATA_INDEX + step * 4096 + r))
            rows.append(torch.randn(self.width, generator=gen))
        x = torch.stack(rows)
        return (x.to(dtype) if inputs else None), (torch.sin(x).to(dtype) if targets else None)


def block_cut(blocks: int, num_stages: int) -> list[list[int]]:
    """Block indices of each stage, as even as the count allows."""
    out, start = [], 0
    for count in stage_block_counts(blocks, num_stages):
        out.append(list(range(start, start + count)))
        start += count
    return out


def block_layout(blocks: int, num_stages: int) -> list[list[int]]:
    """Module indices of each stage: whole blocks of three modules."""
    return [[3 * b + i for b in stage for i in range(3)] for stage in block_cut(blocks, num_stages)]


def build(cfg, device="cpu") -> Workload:
    """The workload of a run of the tiny model (cfg: RunConfig): its stream is the one the registry gave it."""
    m, seed = cfg.model.options, cfg.model.seed
    stream = registry.entry(cfg.model.name).seed_streams[0]
    modules: list[nn.Module] = []
    for b in range(m.blocks):
        modules += [StreamLinear(m.width, 2 * m.width, seed, stream, 2 * b), nn.Tanh(),
                    StreamLinear(2 * m.width, m.width, seed, stream, 2 * b + 1)]
    return Workload(
        name=cfg.model.name, model=nn.Sequential(*modules), loss=losses.MSE(), parallelize=parallelize_mlp,
        layout_fn=lambda n: block_layout(m.blocks, n), data=SineData(m.width, seed, stream),
        flops_per_sample=6.0 * 4 * m.width**2 * m.blocks, tokens_per_sample=1,
        checkpoint_model={"name": cfg.model.name, "width": m.width, "blocks": m.blocks, "seed": seed},
        summary=f"model: tiny, {m.blocks} x [Linear({m.width}, {2 * m.width}) + Tanh + Linear], sin(x) (seed {seed})",
        layer_names=[f"{kind} {b}" for b in range(m.blocks) for kind in ("up", "tanh", "down")],
        layer_costs=[1.0, 0.0, 1.0] * m.blocks)


def check(cfg, grid, device_type: str) -> None:
    """Every stage holds a block; MP splits the inner width."""
    m = cfg.model.options
    if m.blocks < grid.pp_size * cfg.schedule.chunks:
        raise ConfigError(f"--blocks {m.blocks} is less than the pipeline's stages")
    if (2 * m.width) % grid.mp_size:
        raise ConfigError(f"2 x --width {m.width} is not divisible by --mp {grid.mp_size}")
    if cfg.data.path is not None:
        raise ConfigError("--data: the tiny model trains on its own sine data")


def shape(cfg) -> ModelShape:
    """The planner's view: one layer per block (two GEMMs, one MP all-reduce)."""
    m = cfg.model.options
    w = m.width
    layer = LayerShape(params=4 * w * w + 3 * w, matmul_params=4 * w * w, act_split=4 * w, act_whole=w,
                       stash=6 * w, mp_allreduces=1)
    return ModelShape(cfg.model.name, (layer,) * m.blocks, w, 1, data_bytes=2 * w,
                      flops_per_sample=24.0 * w * w * m.blocks, cut=lambda n, pp=None, placement="loop": block_cut(m.blocks, n))


ENTRY = ModelEntry(options=TinyOptions, build=build, check=check, parallelize=parallelize_mlp, shape=shape)
