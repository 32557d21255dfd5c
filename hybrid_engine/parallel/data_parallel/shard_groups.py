"""Who shares one copy of the sharded state (ZeRO 1-3): the shard group, the copies of it, and the clipping group.

Sharding runs over the DP x CP ranks (`GridGroups.dp_cp`: the ranks that hold the same parameters and sum their
gradients; the dp group itself while cp = 1). With `--zero-shard-size N` (hybrid sharding) those ranks are cut into
blocks of N consecutive ones: each block holds one sharded copy (gradients reduce-scattered and parameters
all-gathered within it), and the blocks are replicas of each other (each shard's summed gradient all-reduced across
the blocks, over the ranks of the same position in every block).

The global gradient norm sums every element once: over the ranks whose shards together make up the model once,
i.e. this rank's block in every pipeline stage's DP x CP group with this rank's MP coordinate.

dist.new_group is collective over the world, so every rank creates every group here, in one order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist


@dataclass
class ShardGroups:
    shard: dist.ProcessGroup | None  # the ranks of one sharded copy (None: no process group, a single rank)
    rank: int  # this rank's position in it: which piece of every bucket it owns
    size: int
    replicas: dist.ProcessGroup | None  # the same position in every copy (None: one copy)
    copies: int
    clip: dist.ProcessGroup | None  # where squared norms are summed (None: no clipping)
    made: list = field(default_factory=list)  # groups created here, destroyed by close

    def describe(self) -> str:
        if self.copies == 1:
            return f"sharded over {self.size} data-parallel rank{'s' if self.size > 1 else ''}"
        return (f"sharded over groups of {self.size} data-parallel ranks, replicated {self.copies} times (hybrid: "
                "reduce-scatter within a group, all-reduce across the copies)")

    def close(self) -> None:
        for group in self.made:
            dist.destroy_process_group(group)
        self.made.clear()


def _dp_cp_lists(grid) -> list[list[int]]:
    """Every DP x CP group's global ranks, in the order its group ranks them."""
    return [sorted(ranks) for ranks in grid.groups("dp-cp" if getattr(grid, "cp_size", 1) > 1 else "dp")]


def build_shard_groups(groups, shard_size: int, clip: bool) -> ShardGroups:
    """This rank's ShardGroups; shard_size 0: one copy over all DP x CP ranks (the dp_cp group itself)."""
    grid, me = groups.grid, groups.rank
    lists = _dp_cp_lists(grid)
    width = len(lists[0])
    size = shard_size or width
    copies = width // size
    mine = next(ranks for ranks in lists if me in ranks)
    position = mine.index(me)
    block, rank = divmod(position, size)
    made: list = []
    distributed = dist.is_initialized()

    def new_group(ranks: list[int]) -> dist.ProcessGroup:
        group = dist.new_group(ranks)
        made.append(group)
        return group

    shard, replicas = (groups.dp_cp if distributed else None), None
    if copies > 1 and distributed:
        for ranks in lists:
            for b in range(copies):
                group = new_group(ranks[b * size:(b + 1) * size])
                if ranks is mine and b == block:
                    shard = group
            for r in range(size):
                group = new_group(ranks[r::size])
                if ranks is mine and r == rank:
                    replicas = group
    clip_group = None
    if clip and distributed:
        for m in range(grid.mp_size):
            for b in range(copies):
                ranks = sorted(r for dp_cp in lists if grid.coords(dp_cp[0]).mp == m
                               for r in dp_cp[b * size:(b + 1) * size])
                group = new_group(ranks)
                if groups.coords.mp == m and b == block:
                    clip_group = group
    return ShardGroups(shard, rank, size, replicas, copies, clip_group, made)
