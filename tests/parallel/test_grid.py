"""The C++ ProcessGrid against an independent brute-force oracle, for every grid of up to 16 ranks.

The oracle (tests/grid_oracle.py) never does rank arithmetic: it enumerates coordinates in the order's nesting
and groups ranks by the coordinates they share.
"""
from __future__ import annotations

import itertools

import pytest
from grid_oracle import AXES, Oracle

from hybrid_engine import _C

ORDERS = ["-".join(p) for p in itertools.permutations(AXES)]
MAX_WORLD = 16


def factorizations(world: int):
    for dp in range(1, world + 1):
        for pp in range(1, world // dp + 1):
            if world % (dp * pp) == 0:
                yield dp, pp, world // (dp * pp)


CASES = [(w, order) for w in range(1, MAX_WORLD + 1) for order in ORDERS]


def test_factorizations_cover_every_grid():
    # 1..16 has sum over w of d3(w) ordered factorizations; spot-check a few counts to trust the loop.
    assert len(list(factorizations(1))) == 1
    assert len(list(factorizations(8))) == 10  # 2^3: C(3+2, 2)
    assert len(list(factorizations(12))) == 18  # 2^2 * 3: C(4,2) * 3
    assert sorted(factorizations(4)) == sorted([(1, 1, 4), (1, 4, 1), (4, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 1)])


@pytest.mark.parametrize("world,order", CASES, ids=[f"w{w}-{o}" for w, o in CASES])
def test_grid_matches_oracle(world: int, order: str):
    for dp, pp, mp in factorizations(world):
        grid = _C.ProcessGrid(dp, pp, mp, order)
        oracle = Oracle(dp, pp, mp, order)
        label = f"dp={dp} pp={pp} mp={mp} order={order}"
        assert (grid.dp_size, grid.pp_size, grid.mp_size) == (dp, pp, mp), label
        assert grid.world_size == oracle.world_size == world, label
        assert grid.order == order, label
        grid.check_world_size(world)

        for rank in range(world):
            c = grid.coords(rank)
            expected = oracle.coords[rank]
            assert (c.dp, c.pp, c.mp) == (expected["dp"], expected["pp"], expected["mp"]), f"{label} rank {rank}"
            assert tuple(c) == (c.dp, c.pp, c.mp)
            assert grid.rank_of(c.dp, c.pp, c.mp) == rank, f"{label} rank {rank}"
            assert grid.pp_prev(rank) == oracle.pp_neighbour(rank, -1), f"{label} rank {rank}"
            assert grid.pp_next(rank) == oracle.pp_neighbour(rank, +1), f"{label} rank {rank}"

        for axis in AXES:
            groups = grid.groups(axis)
            assert groups == oracle.groups(axis), f"{label} axis {axis}"
            assert sorted(r for g in groups for r in g) == list(range(world)), f"{label} axis {axis}"
            assert all(len(g) == getattr(grid, f"{axis}_size") for g in groups)
            for g in groups:
                # A rank's index in its group is its coordinate along the axis.
                assert [getattr(grid.coords(r), axis) for r in g] == list(range(len(g))), f"{label} {axis} {g}"
                for r in g:
                    assert grid.group_of(r, axis) == g, f"{label} axis {axis} rank {r}"

        mp_groups = grid.model_parallel_groups()
        assert mp_groups == oracle.model_parallel_groups(), label
        assert sorted(r for g in mp_groups for r in g) == list(range(world)), label
        assert all(len(g) == pp * mp for g in mp_groups), label
        for g in mp_groups:
            for r in g:
                assert grid.model_parallel_group_of(r) == g, f"{label} rank {r}"


def test_default_order_is_the_documented_worked_example():
    grid = _C.ProcessGrid(2, 2, 2)
    assert grid.order == "mp-dp-pp"
    assert [tuple(grid.coords(r)) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
    assert grid.groups("mp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.model_parallel_groups() == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize("axis_index,axis", list(enumerate(AXES)))
@pytest.mark.parametrize("bad", [0, -3])
def test_size_below_one_names_axis_and_value(axis_index: int, axis: str, bad: int):
    sizes = [2, 2, 2]
    sizes[axis_index] = bad
    with pytest.raises(ValueError) as info:
        _C.ProcessGrid(*sizes)
    message = str(info.value)
    assert axis in message and str(bad) in message


def test_unknown_axis_is_named():
    with pytest.raises(ValueError, match="'xp'"):
        _C.ProcessGrid(1, 1, 1, "mp-xp-pp")


def test_repeated_axis_is_named():
    with pytest.raises(ValueError, match="'dp' is repeated"):
        _C.ProcessGrid(1, 1, 1, "dp-pp-dp")


@pytest.mark.parametrize("order", ["mp-dp", "mp-dp-pp-dp", "", "mpdppp"])
def test_wrong_number_of_axes_is_rejected(order: str):
    with pytest.raises(ValueError, match="must name dp, pp and mp once each"):
        _C.ProcessGrid(1, 1, 1, order)


def test_world_size_mismatch_message():
    grid = _C.ProcessGrid(3, 2, 2)
    with pytest.raises(ValueError) as info:
        grid.check_world_size(8)
    message = str(info.value)
    assert "3 x 2 x 2 = 12" in message and "8" in message


def test_out_of_range_rank_and_coordinate_raise():
    grid = _C.ProcessGrid(2, 2, 2)
    for rank in (-1, 8):
        with pytest.raises(IndexError):
            grid.coords(rank)
    with pytest.raises(IndexError):
        grid.rank_of(2, 0, 0)
    with pytest.raises(ValueError):
        grid.groups("xp")
