"""Layers -> pipeline stages.

A model is an nn.Sequential. Its modules are first grouped into *blocks*: a module with parameters starts a
block, and the parameter-free modules after it (activations, dropout, reshapes) join that block, so a
Linear is never split from its ReLU. Blocks are then cut into `num_stages` contiguous runs:

    stage i gets floor(n / S) blocks, and the first (n mod S) stages get one more.

Earlier stages take the extra block because the last stage also computes the loss. With virtual stages,
S = pp * v; which pipeline rank holds which stage is the schedule's placement (csrc/schedule/placement.h).
"""
from __future__ import annotations

import torch.nn as nn

import hybrid_engine._C as _C


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def blocks_of(model: nn.Sequential) -> list[list[int]]:
    """Module indices grouped into blocks (a parametered module plus the parameter-free ones after it)."""
    blocks: list[list[int]] = []
    for index, module in enumerate(model):
        if _has_params(module) or not blocks:
            blocks.append([index])
        else:
            blocks[-1].append(index)
    return blocks


def stage_block_counts(num_blocks: int, num_stages: int) -> list[int]:
    if num_stages < 1:
        raise ValueError(f"number of stages must be >= 1, got {num_stages}")
    if num_blocks < num_stages:
        raise ValueError(
            f"the model has {num_blocks} layers but the pipeline needs at least one per stage "
            f"(pp x virtual stages = {num_stages})"
        )
    base, extra = divmod(num_blocks, num_stages)
    return [base + (1 if stage < extra else 0) for stage in range(num_stages)]


def partition(model: nn.Sequential, num_stages: int) -> list[list[int]]:
    """Module indices of each stage, in order."""
    blocks = blocks_of(model)
    stages: list[list[int]] = []
    start = 0
    for count in stage_block_counts(len(blocks), num_stages):
        stages.append([i for block in blocks[start : start + count] for i in block])
        start += count
    return stages


def check_layout(layout: list[list[int]], num_modules: int, num_stages: int) -> list[list[int]]:
    """A user's stage layout, validated: one non-empty list per stage, contiguous, covering every module in order."""
    lists = [list(stage) for stage in layout]
    flat = [i for stage in lists for i in stage]
    if len(lists) != num_stages or any(not stage for stage in lists) or flat != list(range(num_modules)):
        raise ValueError(f"layout must give each of the {num_stages} stages (pp x virtual stages) a non-empty, "
                         f"contiguous run of module indices, together 0 .. {num_modules - 1} in order; got {layout}")
    return lists


def stages_of_rank(pp_rank: int, pp_size: int, virtual_stages: int, placement: str = "loop") -> list[int]:
    """Global stage indices held by a pipeline rank, ascending (the placement's, csrc/schedule/placement.h)."""
    return _C.schedule.rank_stages(pp_rank, pp_size, pp_size * virtual_stages, placement)
