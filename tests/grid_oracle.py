"""Brute-force process grid for tests: no rank arithmetic, only enumeration and grouping.

Coordinates are enumerated with itertools.product in the order's nesting (slowest axis outermost, so the
fastest-varying axis is the last factor) and numbered 0, 1, 2, ...; groups come from grouping ranks by the
coordinates they share.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

AXES = ("dp", "pp", "mp")


class Oracle:
    """Brute-force grid: rank -> coords by enumeration, groups by grouping."""

    def __init__(self, dp: int, pp: int, mp: int, order: str):
        sizes = {"dp": dp, "pp": pp, "mp": mp}
        fastest_first = order.split("-")
        slowest_first = list(reversed(fastest_first))
        self.coords: list[dict[str, int]] = []
        for values in itertools.product(*(range(sizes[a]) for a in slowest_first)):
            self.coords.append(dict(zip(slowest_first, values)))
        self.world_size = len(self.coords)
        self.rank_of = {tuple(c[a] for a in AXES): rank for rank, c in enumerate(self.coords)}

    def groups(self, axis: str) -> list[list[int]]:
        others = [a for a in AXES if a != axis]
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for rank, c in enumerate(self.coords):
            buckets[tuple(c[a] for a in others)].append(rank)
        groups = [sorted(members, key=lambda r: self.coords[r][axis]) for members in buckets.values()]
        return sorted(groups, key=min)

    def model_parallel_groups(self) -> list[list[int]]:
        buckets: dict[int, list[int]] = defaultdict(list)
        for rank, c in enumerate(self.coords):
            buckets[c["dp"]].append(rank)
        return sorted((sorted(m) for m in buckets.values()), key=min)

    def pp_neighbour(self, rank: int, step: int) -> int:
        c = dict(self.coords[rank])
        c["pp"] += step
        return self.rank_of.get(tuple(c[a] for a in AXES), -1)
