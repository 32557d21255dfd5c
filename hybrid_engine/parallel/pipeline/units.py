"""Stage cuts inside a transformer block: a block's attention half on one stage, its MLP half on the next.

Whole blocks are coarse units for a pipeline. The GPT-1B at pp4 has twelve blocks and a head that costs about one
more: 13 units over 4 ranks, so some rank holds 4 where the mean is 3.25, and every rank waits for it (0.81 of
the balanced speed, whatever the schedule). A pre-norm block is two residual branches, x + attention(x) and then
x + mlp(x); each half takes and returns the residual stream, so a cut between them sends the same [b, s, h]
tensor any cut between blocks sends.

A block class offers its halves by declaring `RESIDUAL_HALVES`: {method: names of the sub-modules and buffers
that method reads}, in forward order, with `forward(x)` equal to applying `x = x + self.<method>(x)` for each.
`half_of` builds one half: an instance of a subclass of the block's own class (so whatever recognises a block,
a tensor-parallel plan, selective recompute, fused kernels, context parallelism, still does) that holds only its
half's sub-modules, under their names in the block. A half's parameters therefore keep the block's names
("<module index>.<name>", what checkpoints hold), and a half draws its initial weights from the block's own
generator (the block's `full_weights`, of which it keeps its own).

A layout names a half as `Half(module, part)`, a whole module by its index; `unit_sequence` turns such a layout
into the Sequential of units the engine cuts, with each unit's module index. `place` is the rule for when to cut
inside blocks (asked by the workloads and the planner alike).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch.nn as nn

import hybrid_engine._C as _C

from .balance import balanced_partition, entry_cost, stage_costs
from .partition import check_layout, partition

__all__ = ["Half", "AUTO_GAIN", "half_of", "halves_of", "unit_sequence", "stage_units", "place", "LayoutRule",
           "unit_module"]

# auto cuts inside blocks only where that lowers the busiest pipeline rank's work by more than this share of it:
# below it the gain is within the cost model's error
AUTO_GAIN = 0.03


class Half(NamedTuple):
    """One residual half of module `module` of the model: its `part`, a method named in RESIDUAL_HALVES."""
    module: int
    part: str


def unit_module(unit: int | Half) -> int:
    """The model's module index of a layout entry."""
    return unit.module if isinstance(unit, Half) else unit


def halves_of(module: nn.Module) -> tuple[str, ...]:
    """The residual halves a module offers, in forward order (none: it is placed whole)."""
    return tuple(getattr(type(module), "RESIDUAL_HALVES", {}))


class _ResidualHalf:
    """forward(x) = x + self.<part>(x): one residual branch of the block class it is mixed into."""

    part: str
    _BLOCK_BUFFERS: tuple[str, ...] = ()

    def forward(self, x):
        return x + getattr(self, self.part)(x)

    def reset_buffers(self) -> None:  # the block's derived buffers, where this half holds them
        if type(self)._BLOCK_BUFFERS:
            super().reset_buffers()


def half_of(block: nn.Module, part: str) -> nn.Module:
    """Half `part` of `block`: its sub-modules and buffers (shared with the block, on any device, meta included),
    its plain attributes (configuration, index, flags), the block's methods; forward is that half's branch."""
    declared = getattr(type(block), "RESIDUAL_HALVES", {})
    if part not in declared:
        raise ValueError(f"{type(block).__name__} has no residual half {part!r} (it offers {sorted(declared)})")
    cls = type(f"{type(block).__name__}[{part}]", (_ResidualHalf, type(block)),
               {"part": part, "_BLOCK_BUFFERS": tuple(n for n in declared[part] if n in block._buffers),
                "__module__": type(block).__module__})
    half = cls.__new__(cls)
    nn.Module.__init__(half)
    for key, value in vars(block).items():
        if not key.startswith("_"):
            object.__setattr__(half, key, value)
    for name in declared[part]:
        if name in block._modules:
            half._modules[name] = block._modules[name]
        elif name in block._buffers:
            half.register_buffer(name, block._buffers[name], persistent=name not in block._non_persistent_buffers_set)
        else:
            raise ValueError(f"{type(block).__name__}.RESIDUAL_HALVES[{part!r}] names {name!r}, which it does not hold")
    return half


def unit_sequence(model: nn.Sequential, layout: Sequence[Sequence[int | Half]]
                  ) -> tuple[nn.Sequential, list[list[int]], list[int]]:
    """(units, layout over them, each unit's module index): the model with every block the layout names by halves
    replaced by those halves, and the layout as positions in it. A layout of whole modules comes back as it is."""
    split = {u.module for stage in layout for u in stage if isinstance(u, Half)}
    if not split:
        return model, [list(stage) for stage in layout], list(range(len(model)))
    units: list[nn.Module] = []
    module_index: list[int] = []
    position: dict[int | Half, int] = {}
    for i, module in enumerate(model):
        if i in split:
            parts = halves_of(module)
            if not parts:
                raise ValueError(f"layout splits module {i} ({type(module).__name__}), which has no residual halves")
            for part in parts:
                position[Half(i, part)] = len(units)
                units.append(half_of(module, part))
                module_index.append(i)
        else:
            position[i] = len(units)
            units.append(module)
            module_index.append(i)
    try:
        positions = [[position[u] for u in stage] for stage in layout]
    except KeyError as missing:
        raise ValueError(f"layout names {missing.args[0]!r}: a module whose halves are placed must be named by "
                         "its halves only, each once") from None
    return nn.Sequential(*units), positions, module_index


def stage_units(model: nn.Sequential, layout: Sequence[Sequence[int | Half]] | None, num_stages: int
                ) -> tuple[nn.Sequential, list[list[int]], list[int]]:
    """What an engine cuts: (units, each stage's positions in them, each unit's module index) of `layout`
    (unit_sequence, then checked: contiguous, covering every unit), or of a cut by layer count where it is None."""
    if layout is None:
        return model, partition(model, num_stages), list(range(len(model)))
    units, positions, module_index = unit_sequence(model, layout)
    return units, check_layout(positions, len(units), num_stages), module_index


def place(costs: Sequence[float], halves: dict[int, tuple[str, ...]], half_costs: Sequence[float],
          num_stages: int, pp: int | None = None, placement: str = "loop", mode: str = "auto"
          ) -> list[list[int | Half]]:
    """The stage layout of `num_stages` stages over `pp` pipeline ranks (None: one stage a rank) placed by
    `placement`: whole modules cut by `balanced_partition(costs)`, or (mode on, or auto where that lowers the
    costliest rank's work by more than AUTO_GAIN) the modules in `halves` (module index -> its parts, in order)
    cut into those parts, costed `half_costs` (shares of the module's cost, in the same order), the cuts moved
    until no single move lowers the costliest rank's work, and a block whose halves land on one stage put back
    whole. A rank's work is the sum of its stages' costs (under virtual stages a rank holds several)."""
    return [list(stage) for stage in _place(tuple(costs), tuple(sorted(halves.items())), tuple(half_costs),
                                             num_stages, pp, placement, mode)]


# A pure function of its arguments, asked again for every plan the planner times (thousands per table): memoized.
@functools.lru_cache(maxsize=512)
def _place(costs: tuple[float, ...], halves_items: tuple, half_costs: tuple[float, ...], num_stages: int,
           pp: int | None, placement: str, mode: str) -> tuple[tuple[int | Half, ...], ...]:
    halves = dict(halves_items)
    pp, ranks = _ranks(num_stages, pp, placement)
    whole = tuple(map(tuple, balanced_partition(costs, num_stages)))
    if mode == "off" or not halves:
        return whole
    units: list[int | Half] = []
    unit_costs: list[float] = []
    for i, cost in enumerate(costs):
        for part, share in (zip(halves[i], half_costs) if i in halves else [(None, 1.0)]):
            units.append(i if part is None else Half(i, part))
            unit_costs.append(cost * share)
    cuts = _rank_balanced(unit_costs, balanced_partition(unit_costs, num_stages), ranks, pp)
    split = tuple(tuple(_rejoin([units[k] for k in stage], halves)) for stage in cuts)
    if mode == "on":
        return split
    worst_whole = max(_rank_loads(costs, [list(stage) for stage in whole], ranks, pp))
    worst_split = max(_rank_loads(unit_costs, cuts, ranks, pp))
    return split if worst_split < (1 - AUTO_GAIN) * worst_whole else whole


@dataclass(frozen=True)
class LayoutRule:
    """A workload's layout: `place` over `model`'s modules, whose blocks offer RESIDUAL_HALVES costed
    `half_costs` (the model's shares, in their order), by the run's --split-blocks `mode`."""

    costs: tuple[float, ...]
    halves: dict
    half_costs: tuple[float, ...]
    mode: str

    @staticmethod
    def of(model: nn.Sequential, costs: Sequence[float], half_costs: Sequence[float], mode: str) -> "LayoutRule":
        return LayoutRule(tuple(costs), {i: halves_of(m) for i, m in enumerate(model) if halves_of(m)},
                          tuple(half_costs), mode)

    @property
    def shares(self) -> dict[str, float]:
        """Each half (by part) -> its share of its block's cost."""
        return dict(zip(next(iter(self.halves.values()), ()), self.half_costs))

    def __call__(self, num_stages: int, pp: int | None = None, placement: str = "loop") -> list[list[int | Half]]:
        return place(self.costs, self.halves, self.half_costs, num_stages, pp, placement, self.mode)

    def describe(self, num_stages: int, pp: int | None = None, placement: str = "loop") -> str | None:
        """The line that says which blocks a layout cuts and what that evens (None: it cuts none)."""
        layout = self(num_stages, pp, placement)
        cut = [u.module for stage in layout[1:] for u in stage[:1] if isinstance(u, Half)]
        if not cut:
            return None
        pp, ranks = _ranks(num_stages, pp, placement)
        loads = [0.0] * pp
        for stage, rank in zip(layout, ranks):
            loads[rank] += sum(entry_cost(u, self.costs, self.shares) for u in stage)
        whole = _rank_loads(self.costs, balanced_partition(self.costs, num_stages), ranks, pp)
        mean = sum(loads) / pp
        return (f"stages end inside module{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))}, between "
                f"attention and MLP (--split-blocks {self.mode}): the busiest pipeline rank's work "
                f"{max(loads) / mean:.2f}x the mean, {max(whole) / mean:.2f}x with whole blocks")


def _ranks(num_stages: int, pp: int | None, placement: str) -> tuple[int, list[int]]:
    """(pipeline ranks, each stage's rank): `placement`'s, one stage a rank where pp is None."""
    pp = num_stages if pp is None else pp
    return pp, [_C.schedule.stage_rank(s, pp, num_stages, placement) for s in range(num_stages)]


def _rank_loads(costs: Sequence[float], stages: list[list[int]], ranks: list[int], pp: int) -> list[float]:
    loads = [0.0] * pp
    for s, total in enumerate(stage_costs(costs, stages)):
        loads[ranks[s]] += total
    return loads


def _rank_balanced(costs: Sequence[float], start: list[list[int]], ranks: list[int], pp: int) -> list[list[int]]:
    """Contiguous stages from `start`, each cut point moved (every stage kept non-empty) while a move lowers the
    costliest rank's work, or keeps it and makes the ranks more even (the sum of squared loads)."""
    bounds = [stage[0] for stage in start] + [len(costs)]
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def score(b: list[int]) -> tuple[float, float]:
        loads = [0.0] * pp
        for s in range(len(b) - 1):
            loads[ranks[s]] += prefix[b[s + 1]] - prefix[b[s]]
        return round(max(loads), 12), round(sum(x * x for x in loads), 12)

    best = score(bounds)
    improved = True
    while improved:
        improved = False
        for k in range(1, len(bounds) - 1):
            for cut in range(bounds[k - 1] + 1, bounds[k + 1]):
                trial = bounds[:k] + [cut] + bounds[k + 1:]
                value = score(trial)
                if value < best:
                    best, bounds, improved = value, trial, True
    return [list(range(bounds[s], bounds[s + 1])) for s in range(len(bounds) - 1)]


def _rejoin(stage: list[int | Half], halves: dict[int, tuple[str, ...]]) -> list[int | Half]:
    """A stage's units with every block whose halves are all on it named whole."""
    out: list[int | Half] = []
    for u in stage:
        if isinstance(u, Half) and u.part == halves[u.module][-1] and out and \
                isinstance(out[-1], Half) and out[-1].module == u.module and len(halves[u.module]) == 2:
            out[-1] = u.module
        else:
            out.append(u)
    return out
