"""The grid as a mesh of named axes (dp, cp, pp, tp alias mp, ep): the C++ ProcessGrid against a brute-force
enumeration for every order and a context-parallel axis, groups over any set of axes, one-line errors naming the
axis, and the printed table and picture covering every axis of size > 1."""
from __future__ import annotations

import itertools

import pytest

from hybrid_engine import _C
from hybrid_engine.parallel.grid import grid_picture, mapping_table
from hybrid_engine.parallel.nodes import NodeMap

MESH_AXES = ("dp", "cp", "pp", "mp")


def enumerate_mesh(sizes: dict[str, int], fastest_first: list[str]) -> list[dict[str, int]]:
    """rank -> coordinates, by enumerating coordinates with the slowest axis outermost (no rank arithmetic)."""
    slowest_first = list(reversed(fastest_first))
    return [dict(zip(slowest_first, values))
            for values in itertools.product(*(range(sizes[a]) for a in slowest_first))]


def full_order(order: str) -> list[str]:
    """The order with cp where process_grid.h puts it when the order leaves it out: right after mp."""
    names = order.split("-")
    return names if "cp" in names else [n for a in names for n in ((a, "cp") if a == "mp" else (a,))]


ORDERS = ["-".join(p) for p in itertools.permutations(MESH_AXES)] + ["-".join(p) for p in
                                                                      itertools.permutations(("dp", "pp", "mp"))]


@pytest.mark.parametrize("order", ORDERS)
def test_a_cp_axis_lays_ranks_out_as_the_order_says(order):
    for dp, cp, pp, mp in ((2, 2, 1, 1), (1, 2, 2, 2), (2, 3, 1, 2), (2, 2, 2, 1)):
        sizes = dict(dp=dp, cp=cp, pp=pp, mp=mp)
        grid = _C.ProcessGrid(dp, pp, mp, order, cp=cp)
        coords = enumerate_mesh(sizes, full_order(order))
        assert grid.world_size == len(coords)
        for rank, expected in enumerate(coords):
            c = grid.coords(rank)
            assert {a: c.get(a) for a in MESH_AXES} == expected, (order, sizes, rank)
            assert grid.rank_of(c.dp, c.pp, c.mp, cp=c.cp) == rank
        for axes in (["cp"], ["dp", "cp"], ["pp", "mp"], ["dp", "cp", "pp", "mp"]):
            by_rest: dict[tuple, list[int]] = {}
            for rank, c in enumerate(coords):
                by_rest.setdefault(tuple(c[a] for a in MESH_AXES if a not in axes), []).append(rank)
            expected_sets = sorted((sorted(g) for g in by_rest.values()), key=min)
            got = grid.groups(axes)
            assert [sorted(g) for g in got] == expected_sets, (order, sizes, axes)
            for g in got:  # ordered by the coordinates, the first axis listed fastest
                keys = [tuple(coords[r][a] for a in reversed(axes)) for r in g]
                assert keys == sorted(keys)
        assert grid.groups("dp-cp") == grid.groups(["dp", "cp"])


def test_cp_of_one_changes_nothing():
    for order in ("mp-dp-pp", "dp-pp-mp", "pp-mp-dp"):
        three, mesh = _C.ProcessGrid(2, 3, 2, order), _C.ProcessGrid(2, 3, 2, order, cp=1)
        assert [tuple(three.coords(r)) for r in range(12)] == [tuple(mesh.coords(r)) for r in range(12)]
        assert mesh.order == order and mesh.groups("dp-cp") == mesh.groups("dp")
        assert mesh.groups("cp") == [[r] for r in range(12)]


def test_the_worked_example_with_cp():
    grid = _C.ProcessGrid(2, 2, 2, cp=2)  # process_grid.h: order mp-dp-pp, cp right after mp
    assert grid.order == "mp-cp-dp-pp" and grid.axes == ["tp", "cp", "ep", "dp", "pp"]
    assert grid.group_of(0, "cp") == [0, 2] and grid.group_of(0, "dp") == [0, 4]
    assert sorted(grid.group_of(0, "dp-cp")) == [0, 2, 4, 6]
    assert grid.model_parallel_group_of(0) == [0, 1, 8, 9]
    assert grid.coords(11).cp == 1 and grid.coords(11).tp == 1 and grid.stride("mp") == 1


@pytest.mark.parametrize("make,message", [
    (lambda: _C.ProcessGrid(1, 1, 1, cp=0), "--cp must be >= 1, got 0"),
    (lambda: _C.ProcessGrid(1, 1, 1, "mp-dp-zp"), "unknown axis 'zp'"),
    (lambda: _C.ProcessGrid(1, 1, 1, "mp-dp-cp"), "axis 'pp' is missing: grid order 'mp-dp-cp' must name dp, pp and mp"),
    (lambda: _C.ProcessGrid(1, 1, 1, "mp-cp-dp-pp-cp"), "axis 'cp' is repeated"),
    (lambda: _C.ProcessGrid(1, 2, 1, cp=2).check_world_size(2), "grid dp x cp x pp x mp = 1 x 2 x 2 x 1 = 4 != world "
                                                                 "size 2"),
    (lambda: _C.ProcessGrid(1, 1, 1).groups("dp-dp"), "axis 'dp' is listed twice in a group"),
])
def test_bad_meshes_name_the_axis(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert message in str(err.value)


def test_tp_and_mp_name_one_axis():
    grid = _C.ProcessGrid(1, 2, 2, "tp-pp-dp")
    assert grid.order == "tp-pp-dp" and grid.tp_size == grid.mp_size == 2
    assert grid.groups("tp") == grid.groups("mp") == [[0, 1], [2, 3]]


def test_the_table_and_the_picture_show_cp_when_it_takes_part():
    grid = _C.ProcessGrid(1, 2, 2, cp=2)
    one_host = NodeMap(("a",) * 8)
    table = mapping_table(grid, one_host, ["cpu"] * 8).splitlines()
    assert table[2].split() == ["rank", "dp", "cp", "pp", "mp", "device"]
    assert table[3 + 3].split() == ["3", "0", "1", "0", "1", "cpu"]  # rank 3: mp 1, cp 1
    picture = grid_picture(grid)
    assert picture.splitlines()[0] == "grid dp=1 x cp=2 x pp=2 x mp=2  (order mp-cp-dp-pp, fastest first)"
    assert "| dp=0 cp=1: [ 2  3]" in picture and "| dp=0 cp=1: [ 6  7]" in picture
    plain = _C.ProcessGrid(2, 2, 2)
    assert "cp=" not in grid_picture(plain)
    assert mapping_table(plain, one_host, ["cpu"] * 8).splitlines()[2].split() == ["rank", "dp", "pp", "mp", "device"]


def _reduce_over_dp_and_cp(rank: int, world: int, cp: int) -> dict:
    import torch
    import torch.distributed as dist

    from hybrid_engine.parallel.grid import build_groups

    grid = _C.ProcessGrid(world // cp, 1, 1, cp=cp)
    groups = build_groups(grid, rank)
    out = {"reuses_dp": groups.dp_cp is groups.dp, "cp_group": groups.cp is not None,
           "named": [label for label, _, _ in groups.named_groups()]}
    for key, group in (("dp_cp", groups.dp_cp), ("cp", groups.cp)):
        if group is not None:
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=group)
            out[key] = t.item()
    groups.destroy()
    return out


def test_gradients_reduce_over_dp_and_cp_and_cp_of_one_makes_no_group():
    from dist_utils import run_ranks

    with_cp = run_ranks(4, _reduce_over_dp_and_cp, 2, timeout=90)  # dp 2 x cp 2: cp groups {0,1} {2,3}
    for rank, out in enumerate(with_cp):
        assert out["dp_cp"] == 0 + 1 + 2 + 3 and out["cp"] == (1 if rank < 2 else 5)
        assert not out["reuses_dp"] and {"cp", "dp x cp"} <= set(out["named"])
    without = run_ranks(2, _reduce_over_dp_and_cp, 1, timeout=90)
    for out in without:
        assert out["reuses_dp"] and not out["cp_group"] and out["dp_cp"] == 1.0
        assert "cp" not in out["named"] and "dp x cp" not in out["named"]
