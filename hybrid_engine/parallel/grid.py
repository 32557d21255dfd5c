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

    def destroy(self) -> None:
        """Release every group this rank belongs to (each holds threads and sockets); all ranks call it."""
        groups = [self.dp, self.pp, self.mp, self.model_parallel] + [c.group for c in self.channels.values()]
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
    )


def mapping_table(grid: _C.ProcessGrid, nodes: NodeMap, devices: list[str]) -> str:
    """Rank -> (dp, pp, mp, device), grouped by host (hosts in the order of their lowest rank)."""
    lines = [f"ranks by host, {nodes.host_summary()}"]
    for host in nodes.names:
        lines.append(f"{host}:")
        lines.append(f"  {'rank':>4} {'dp':>3} {'pp':>3} {'mp':>3}  device")
        for rank in nodes.ranks_on(host):
            c = grid.coords(rank)
            lines.append(f"  {rank:>4} {c.dp:>3} {c.pp:>3} {c.mp:>3}  {devices[rank]}")
    return "\n".join(lines)


def grid_picture(grid: _C.ProcessGrid, nodes: NodeMap | None = None) -> str:
    """ASCII picture of the 3-D grid: one box per pipeline stage, DP replicas as rows, MP ranks as columns. With
    several hosts, each row names its node (n0, n1, ...) and a '|' inside [..] marks where an MP group crosses
    from one node to the next."""
    lines = [f"grid dp={grid.dp_size} x pp={grid.pp_size} x mp={grid.mp_size}  (order {grid.order}, fastest first)"]
    cell = max(len(str(grid.world_size - 1)), 2)
    several = nodes is not None and len(nodes.names) > 1
    for pp in range(grid.pp_size):
        row_cells = []
        for dp in range(grid.dp_size):
            ranks = [grid.rank_of(dp, pp, mp) for mp in range(grid.mp_size)]
            text = f"{ranks[0]:>{cell}}"
            for before, rank in zip(ranks, ranks[1:]):
                crosses = several and nodes.node_of(before) != nodes.node_of(rank)
                text += f"{' |' if crosses else ''} {rank:>{cell}}"
            if several:
                text += "]  " + "|".join(dict.fromkeys(f"n{nodes.node_of(r)}" for r in ranks))
            row_cells.append(text)
        width = max(len(r) for r in row_cells)
        title = f" stage pp={pp} "
        inner = max(width + 12, len(title) + 2)
        lines.append("+" + title.center(inner, "-") + "+")
        for dp, cells in enumerate(row_cells):
            body = f" dp={dp}: [{cells}" + ("" if several else "]")
            lines.append("|" + body.ljust(inner) + "|")
        lines.append("+" + "-" * inner + "+")
        if pp < grid.pp_size - 1:
            lines.append(" " * (inner // 2) + "| activations down, gradients up")
    lines.append("[..] lists the mp ranks of one tensor-parallel group; a column across stages is a pipeline.")
    if several:
        lines.append("nodes: " + ", ".join(f"n{i} = {h} (ranks {rank_ranges(nodes.ranks_on(h))})"
                                           for i, h in enumerate(nodes.names)))
    return "\n".join(lines)
