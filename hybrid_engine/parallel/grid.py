"""ProcessGrid (C++) -> torch.distributed process groups.

`torch.distributed.new_group` is collective over the whole world, so every rank creates every group, in the
same order; each rank then keeps the ones it belongs to. Pipeline traffic gets its own two-rank groups, one
per (sender, receiver, kind): a channel carries one direction of one kind of tensor, so sends and receives
on it pair up first-in first-out and traffic on one channel can never block another (see
hybrid_engine/parallel/pipeline/schedule.py for the ordering that the simulator checks).

Every group waits for a missing peer as long as the world group does (--comm-timeout), never torch's default
for `new_group` (30 minutes): a frozen peer must end the others within the timeout, as a dead one does.
"""
from __future__ import annotations

import datetime
import itertools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import hybrid_engine._C as _C
from .nodes import NodeMap, rank_ranges

ACTIVATION = "act"
GRADIENT = "grad"


@dataclass
class Channel:
    """One direction of pipeline traffic between two pipeline ranks of the same replica/MP slice."""

    group: dist.ProcessGroup
    peer_group_rank: int  # the peer's rank *within* `group` (what c10d send/recv take)


@dataclass
class GridGroups:
    """The process groups one rank belongs to."""

    grid: _C.ProcessGrid
    rank: int
    dp: dist.ProcessGroup
    pp: dist.ProcessGroup
    mp: dist.ProcessGroup
    model_parallel: dist.ProcessGroup  # PP x MP ranks of this replica: where the loss scaler agrees
    pp_ranks: list[int]  # global ranks of this rank's pipeline, by pp coordinate
    # (src pp rank, dst pp rank, kind) -> channel, only for channels this rank sends or receives on
    channels: dict[tuple[int, int, str], Channel] = field(default_factory=dict)
    # The context-parallel group (None while cp = 1), and the DP x CP group gradients reduce over: the dp group
    # itself while cp = 1 (no group of its own: creating one is a collective every rank pays for).
    cp: dist.ProcessGroup | None = None
    dp_cp: dist.ProcessGroup | None = None

    def __post_init__(self):
        if self.dp_cp is None:
            self.dp_cp = self.dp

    def destroy(self) -> None:
        """Release every group this rank belongs to (each holds threads and sockets); all ranks call it."""
        groups = [self.dp, self.pp, self.mp, self.model_parallel] + [c.group for c in self.channels.values()]
        groups += [g for g in (self.cp, self.dp_cp) if g is not None and g is not self.dp]
        for group in groups:
            dist.destroy_process_group(group)
        self.channels.clear()

    @property
    def coords(self) -> _C.GridCoord:
        return self.grid.coords(self.rank)

    def named_groups(self) -> list[tuple[str, dist.ProcessGroup, list[int]]]:
        """(label, group, global ranks) of every group this rank belongs to, in one order all ranks share: the
        axes (mp, dp, pp, the replica's PP x MP), then the pipeline channels by (src, dst, kind). Two ranks of a
        group reach it in the same position of their lists, so visiting them in turn never deadlocks."""
        g, r = self.grid, self.rank
        named = [("mp", self.mp, g.group_of(r, "mp")), ("dp", self.dp, g.group_of(r, "dp")),
                 ("pp", self.pp, g.group_of(r, "pp")),
                 ("model-parallel", self.model_parallel, g.model_parallel_group_of(r))]
        if self.cp is not None:
            named += [("cp", self.cp, g.group_of(r, "cp")), ("dp x cp", self.dp_cp, g.group_of(r, "dp-cp"))]
        for (src, dst, kind), channel in sorted(self.channels.items()):
            ranks = [self.pp_ranks[src], self.pp_ranks[dst]]
            named.append((f"pp {kind} channel {src}->{dst}", channel.group, ranks))
        return named


def pipeline_channel_pairs(pp: int) -> list[tuple[int, int]]:
    """Ordered (src, dst) pp-rank pairs that may carry traffic, ascending: every hop between consecutive stages
    of every stage placement (csrc/schedule/placement.h), both ways. Loop's two chunks per rank give the
    neighbours and the ring's closing hop (the last rank's chunk output on to the first rank's next chunk), which
    cover v's hops and those of any chunk count."""
    pairs: set[tuple[int, int]] = set()
    for placement in _C.schedule.placement_names():
        ranks = [_C.schedule.stage_rank(s, pp, 2 * pp, placement) for s in range(2 * pp)]
        for src, dst in zip(ranks, ranks[1:]):
            if src != dst:
                pairs |= {(src, dst), (dst, src)}
    return sorted(pairs)


def world_timeout() -> datetime.timedelta:
    """How long the world group's collectives wait for a peer (init_process_group's `timeout`)."""
    world = dist.group.WORLD
    for device in ("cuda", "cpu"):
        try:
            return world._get_backend(torch.device(device)).options._timeout
        except Exception:  # noqa: BLE001 - no backend for this device, or a torch without these attributes
            continue
    return dist.default_pg_timeout


def build_groups(grid: _C.ProcessGrid, rank: int, *, timeout_s: float | None = None) -> GridGroups:
    """Create every group of the grid on every rank (same order everywhere) and return this rank's. Each group's
    collectives give up after `timeout_s` seconds (default: the world group's timeout)."""
    timeout = world_timeout() if timeout_s is None else datetime.timedelta(seconds=timeout_s)

    def new_group(ranks: list[int]) -> dist.ProcessGroup:
        return dist.new_group(ranks, timeout=timeout)

    mine: dict[str, dist.ProcessGroup] = {}
    for axis in ("mp", "dp", "pp"):
        for ranks in grid.groups(axis):
            group = new_group(ranks)
            if rank in ranks:
                mine[axis] = group
    for ranks in grid.model_parallel_groups():
        group = new_group(ranks)
        if rank in ranks:
            mine["model_parallel"] = group
    if grid.cp_size > 1:  # with cp = 1 the DP x CP group is the dp group, and there is no cp group to make
        for axes, key in (("cp", "cp"), ("dp-cp", "dp_cp")):
            for ranks in grid.groups(axes):
                group = new_group(sorted(ranks))
                if rank in ranks:
                    mine[key] = group

    channels: dict[tuple[int, int, str], Channel] = {}
    for pp_ranks in grid.groups("pp"):
        for src, dst in pipeline_channel_pairs(grid.pp_size):
            for kind in (ACTIVATION, GRADIENT):
                members = sorted((pp_ranks[src], pp_ranks[dst]))
                group = new_group(members)
                if rank in members:
                    peer = pp_ranks[dst] if rank == pp_ranks[src] else pp_ranks[src]
                    channels[(src, dst, kind)] = Channel(group, members.index(peer))

    return GridGroups(
        grid=grid,
        rank=rank,
        dp=mine["dp"],
        pp=mine["pp"],
        mp=mine["mp"],
        model_parallel=mine["model_parallel"],
        pp_ranks=grid.group_of(rank, "pp"),
        channels=channels,
        cp=mine.get("cp"),
        dp_cp=mine.get("dp_cp"),
    )


# The axes besides dp, pp and mp that the table and the picture show, when they take part (size > 1).
OPTIONAL_AXES = ("cp", "ep")


def _shown_axes(grid: _C.ProcessGrid) -> list[str]:
    """dp, then cp and ep where > 1, then pp and mp: every axis of the grid that tells ranks apart."""
    return ["dp", *(a for a in OPTIONAL_AXES if grid.size(a) > 1), "pp", "mp"]


def mapping_table(grid: _C.ProcessGrid, nodes: NodeMap, devices: list[str]) -> str:
    """Rank -> (dp, [cp, ep,] pp, mp, device), grouped by host (hosts in the order of their lowest rank)."""
    axes = _shown_axes(grid)
    lines = [f"ranks by host, {nodes.host_summary()}"]
    for host in nodes.names:
        lines.append(f"{host}:")
        lines.append(f"  {'rank':>4} " + " ".join(f"{a:>3}" for a in axes) + "  device")
        for rank in nodes.ranks_on(host):
            c = grid.coords(rank)
            lines.append(f"  {rank:>4} " + " ".join(f"{c.get(a):>3}" for a in axes) + f"  {devices[rank]}")
    return "\n".join(lines)


def grid_picture(grid: _C.ProcessGrid, nodes: NodeMap | None = None) -> str:
    """ASCII picture of the grid: one box per pipeline stage, data-parallel replicas (and their cp and ep peers,
    when those axes are > 1) as rows, MP ranks as columns. With several hosts, each row names its node (n0, n1,
    ...) and a '|' inside [..] marks where an MP group crosses from one node to the next."""
    axes = _shown_axes(grid)
    lines = ["grid " + " x ".join(f"{a}={grid.size(a)}" for a in axes) +
             f"  (order {grid.order}, fastest first)"]
    cell = max(len(str(grid.world_size - 1)), 2)
    several = nodes is not None and len(nodes.names) > 1
    row_axes = axes[:-2]  # dp and any cp, ep: one row per combination, dp slowest
    for pp in range(grid.pp_size):
        row_cells, labels = [], []
        for values in itertools.product(*(range(grid.size(a)) for a in row_axes)):
            where = dict(zip(row_axes, values))
            ranks = [grid.rank_of(where["dp"], pp, mp, cp=where.get("cp", 0), ep=where.get("ep", 0))
                     for mp in range(grid.mp_size)]
            text = f"{ranks[0]:>{cell}}"
            for before, rank in zip(ranks, ranks[1:]):
                crosses = several and nodes.node_of(before) != nodes.node_of(rank)
                text += f"{' |' if crosses else ''} {rank:>{cell}}"
            if several:
                text += "]  " + "|".join(dict.fromkeys(f"n{nodes.node_of(r)}" for r in ranks))
            row_cells.append(text)
            labels.append(" ".join(f"{a}={v}" for a, v in where.items()))
        width = max(len(r) for r in row_cells) + max(len(label) for label in labels) - len("dp=0")
        title = f" stage pp={pp} "
        inner = max(width + 12, len(title) + 2)
        lines.append("+" + title.center(inner, "-") + "+")
        for label, cells in zip(labels, row_cells):
            body = f" {label}: [{cells}" + ("" if several else "]")
            lines.append("|" + body.ljust(inner) + "|")
        lines.append("+" + "-" * inner + "+")
        if pp < grid.pp_size - 1:
            lines.append(" " * (inner // 2) + "| activations down, gradients up")
    lines.append("[..] lists the mp ranks of one tensor-parallel group; a column across stages is a pipeline.")
    if several:
        lines.append("nodes: " + ", ".join(f"n{i} = {h} (ranks {rank_ranges(nodes.ranks_on(h))})"
                                           for i, h in enumerate(nodes.names)))
    return "\n".join(lines)
