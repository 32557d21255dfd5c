"""Which ranks share a host: the node map every rank builds from the gathered host names (train/cli.py gathers
them once, before the first step), and the rule that keeps each MP group inside one node.

MP is the axis that talks most: a tensor-parallel layer all-reduces (or all-gathers and reduce-scatters) its
activations in the forward and their gradients in the backward, every layer, every micro-batch. Inside a node that
traffic rides NVLink; across nodes it crosses the network, typically an order of magnitude slower, and the whole
step waits for it. The default order (mp-dp-pp: MP peers are adjacent ranks) keeps MP groups inside a node when the
launcher numbers ranks node by node (torchrun, srun's default block distribution) and mp divides the GPUs per node.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from hybrid_engine.config import ConfigError

HOST_OVERRIDE = "HYBRID_ENGINE_HOST"


def host_name() -> str:
    """This process's host as the node map sees it: the machine's name, or HYBRID_ENGINE_HOST where set (tests
    stand two torchrun agents on one machine for two nodes; a cluster whose hostnames are not unique can set it)."""
    return os.environ.get(HOST_OVERRIDE) or socket.gethostname()


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


@dataclass(frozen=True)
class NodeMap:
    """hosts[rank]: each rank's host. Nodes are numbered by their lowest rank."""

    hosts: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        """Every host once, in the order of its lowest rank."""
        return list(dict.fromkeys(self.hosts))

    def node_of(self, rank: int) -> int:
        return self.names.index(self.hosts[rank])

    def ranks_on(self, host: str) -> list[int]:
        return [r for r, h in enumerate(self.hosts) if h == host]

    def describe_ranks(self, ranks: list[int]) -> str:
        """'ranks 2, 3 (hosts a, b)': a group named with where its members run."""
        hosts = list(dict.fromkeys(self.hosts[r] for r in ranks))
        return f"ranks {', '.join(map(str, ranks))} (host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})"

    def host_summary(self) -> str:
        """'2 hosts: a (ranks 0-3), b (ranks 4-7)'."""
        names = self.names
        return (f"{len(names)} host{'s' if len(names) > 1 else ''}: "
                + ", ".join(f"{h} (ranks {rank_ranges(self.ranks_on(h))})" for h in names))

    def spanning(self, groups: list[list[int]]) -> list[list[int]]:
        """The groups whose members are not all on one host."""
        return [g for g in groups if len({self.hosts[r] for r in g}) > 1]


def check_mp_within_nodes(grid, nodes: NodeMap, allow: bool) -> str | None:
    """None when every MP group sits on one host. Otherwise the one line that says which group spans hosts, why,
    and what it costs: raised as a ConfigError (every rank finds it alike: printed once), or returned for rank 0
    to print when `allow` (--allow-cross-node-mp)."""
    spanning = nodes.spanning([list(g) for g in grid.groups("mp")])
    if not spanning:
        return None
    per_node = min(len(nodes.ranks_on(h)) for h in nodes.names)
    if grid.mp_size > per_node:
        why = f"--mp {grid.mp_size} is more than the {per_node} rank{'s' if per_node > 1 else ''} of a node"
    elif grid.stride("mp") != 1:
        why = f"--order {grid.order} does not put MP peers on adjacent ranks (mp-dp-pp does)"
    elif per_node % grid.mp_size:
        why = f"a node's {per_node} ranks are not a multiple of --mp {grid.mp_size}"
    else:
        why = "the launcher numbers ranks across nodes, not node by node (srun --distribution=block does)"
    more = f" and {len(spanning) - 1} more MP group{'s' if len(spanning) > 2 else ''}" if len(spanning) > 1 else ""
    line = (f"the MP group of {nodes.describe_ranks(spanning[0])}{more} spans hosts ({why}): its all-reduces, in "
            "every layer of every micro-batch, would cross the network instead of staying inside a node, typically "
            "several times slower")
    if allow:
        return f"warning: {line} (--allow-cross-node-mp)"
    raise ConfigError(f"{line}; choose --mp and --order so that MP groups stay within a node, or pass "
                      "--allow-cross-node-mp")
