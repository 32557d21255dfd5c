"""Contiguous stages of about equal cost: the layer ranges that minimise the most expensive stage.

parallel/pipeline/partition.py cuts by layer count (every layer weighs the same), right for the course MLP. A GPT's layers do not
weigh the same: the head over a large vocabulary costs about one block, the embedding almost nothing. Given a
cost per layer (e.g. `models.gpt.layer_costs`), `balanced_partition` finds the cut that minimises the largest
stage cost exactly (dynamic programming over cut points; n layers x S stages, O(S n^2), trivial at n <= 1000).
Among cuts with that smallest maximum it takes the most even one (least sum of squared stage costs), and on a
tie the earliest cut points, which leave the early stages lighter: under 1F1B they hold the most activations.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["balanced_partition", "stage_costs", "entry_cost", "describe_layout"]


def balanced_partition(costs: Sequence[float], num_stages: int) -> list[list[int]]:
    """Layer indices of each of `num_stages` contiguous, non-empty stages, minimising the largest stage cost."""
    n = len(costs)
    if num_stages < 1:
        raise ValueError(f"number of stages must be >= 1, got {num_stages}")
    if n < num_stages:
        raise ValueError(f"the model has {n} layers but the pipeline needs at least one per stage "
                         f"(pp x virtual stages = {num_stages})")
    if any(c < 0 for c in costs):
        raise ValueError(f"layer costs must be >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    largest = _min_max(prefix, num_stages)
    # Second pass: among the cuts whose every stage costs <= that minimum, the one with the smallest sum of
    # squared stage costs (the most even), ties to the earliest cut points.
    limit = largest * (1 + 1e-12) + 1e-15
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                stage = prefix[i] - prefix[j]
                if stage > limit or best[k - 1][j] == inf:
                    continue
                value = best[k - 1][j] + stage * stage
                if value < best[k][i] * (1 - 1e-12):
                    best[k][i], cut[k][i] = value, j
    stages: list[list[int]] = []
    i = n
    for k in range(num_stages, 0, -1):
        j = cut[k][i]
        stages.append(list(range(j, i)))
        i = j
    return stages[::-1]


def _min_max(prefix: list[float], num_stages: int) -> float:
    """The smallest possible largest-stage cost of cutting all layers into `num_stages` contiguous stages."""
    n = len(prefix) - 1
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            best[k][i] = min(max(best[k - 1][j], prefix[i] - prefix[j]) for j in range(k - 1, i))
    return best[num_stages][n]


def stage_costs(costs: Sequence[float], stages: list[list[int]]) -> list[float]:
    return [sum(costs[i] for i in stage) for stage in stages]


def entry_cost(entry, costs: Sequence[float], shares: dict | None = None) -> float:
    """The cost of a layout's entry: a module's (by index), or a block's half's (units.Half: its share of the
    block's; shares: each part's share)."""
    return costs[entry] if isinstance(entry, int) else costs[entry.module] * shares[entry.part]


def describe_layout(names: Sequence[str], costs: Sequence[float], stages: list[list], shares: dict | None = None
                    ) -> str:
    """One line per stage: the model's modules it holds, by index (the indices Engine(layout=) takes and a
    checkpoint's names start with) and by name, and its cost relative to the mean stage (what rank 0 prints).
    A block cut between two stages (units.Half) is named with its half; shares: each half's share of its cost."""
    def name(u) -> str:
        return names[u] if isinstance(u, int) else f"{names[u.module]}'s {u.part}"

    def index(u) -> str:
        return str(u) if isinstance(u, int) else f"{u.module} ({u.part})"

    totals = [sum(entry_cost(u, costs, shares) for u in stage) for stage in stages]
    mean = sum(totals) / len(totals) if totals else 1.0
    lines = []
    for s, (stage, total) in enumerate(zip(stages, totals)):
        first, last = stage[0], stage[-1]
        which = f"module {index(first)}, {name(first)}" if len(stage) == 1 else (
            f"modules {index(first)}-{index(last)}, {name(first)} .. {name(last)}")
        lines.append(f"stage {s}: {which} (cost {total / mean:.2f}x the mean stage)")
    return "\n".join(lines)
