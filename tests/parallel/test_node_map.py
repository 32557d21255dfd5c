"""The node-aware grid in one process: which ranks share a host, the refusal of an MP group across hosts (the line
and its reason), the mapping table grouped by host and the grid picture's node marks."""
import pytest

from hybrid_engine import ProcessGrid
from hybrid_engine.config import ConfigError
from hybrid_engine.parallel.grid import grid_picture, mapping_table
from hybrid_engine.parallel.nodes import NodeMap, check_mp_within_nodes, host_name

TWO_NODES = NodeMap(("a",) * 4 + ("b",) * 4)


def test_the_default_order_keeps_mp_groups_inside_nodes():
    assert check_mp_within_nodes(ProcessGrid(2, 2, 2), TWO_NODES, allow=False) is None
    assert check_mp_within_nodes(ProcessGrid(1, 2, 4), TWO_NODES, allow=False) is None
    assert TWO_NODES.host_summary() == "2 hosts: a (ranks 0-3), b (ranks 4-7)"
    assert [TWO_NODES.node_of(r) for r in (0, 3, 4, 7)] == [0, 0, 1, 1]


def test_an_mp_group_across_hosts_is_refused_in_one_line_naming_it():
    with pytest.raises(ConfigError) as err:
        check_mp_within_nodes(ProcessGrid(1, 1, 8), TWO_NODES, allow=False)
    assert str(err.value) == (
        "the MP group of ranks 0, 1, 2, 3, 4, 5, 6, 7 (hosts a, b) spans hosts (--mp 8 is more than the 4 ranks of a "
        "node): its all-reduces, in every layer of every micro-batch, would cross the network instead of staying "
        "inside a node, typically several times slower; choose --mp and --order so that MP groups stay within a "
        "node, or pass --allow-cross-node-mp")


@pytest.mark.parametrize("grid, nodes, why", [
    (ProcessGrid(2, 2, 2, "dp-pp-mp"), TWO_NODES, "--order dp-pp-mp does not put MP peers on adjacent ranks"),
    (ProcessGrid(3, 1, 2), NodeMap(("a",) * 3 + ("b",) * 3), "a node's 3 ranks are not a multiple of --mp 2"),
    (ProcessGrid(2, 1, 2), NodeMap(("a", "b", "a", "b")), "the launcher numbers ranks across nodes"),
])
def test_the_refusal_says_why_the_group_spans(grid, nodes, why):
    with pytest.raises(ConfigError, match="spans hosts") as err:
        check_mp_within_nodes(grid, nodes, allow=False)
    assert why in str(err.value)


def test_allow_cross_node_mp_turns_the_refusal_into_a_warning_line():
    line = check_mp_within_nodes(ProcessGrid(1, 1, 8), TWO_NODES, allow=True)
    assert line.startswith("warning: the MP group of ranks 0, 1, 2, 3, 4, 5, 6, 7 (hosts a, b) spans hosts")
    assert line.endswith("typically several times slower (--allow-cross-node-mp)") and "\n" not in line


def test_the_mapping_table_groups_ranks_by_host():
    grid = ProcessGrid(2, 2, 2)
    nodes = NodeMap(("b", "b", "a", "a", "b", "b", "a", "a"))  # a host's ranks need not be contiguous
    lines = mapping_table(grid, nodes, ["cpu"] * 8).splitlines()
    assert lines[0] == "ranks by host, 2 hosts: b (ranks 0-1, 4-5), a (ranks 2-3, 6-7)"
    assert lines[1] == "b:" and lines[7] == "a:"
    assert [int(ln.split()[0]) for ln in lines[3:7]] == [0, 1, 4, 5]
    assert lines[10].split() == ["3", "1", "0", "1", "cpu"]  # rank 3: dp 1, pp 0, mp 1


def test_the_grid_picture_marks_nodes_and_where_an_mp_group_crosses_them():
    grid = ProcessGrid(2, 2, 2)
    picture = grid_picture(grid, TWO_NODES)
    assert "| dp=1: [ 2  3]  n0" in picture and "| dp=0: [ 4  5]  n1" in picture
    assert picture.splitlines()[-1] == "nodes: n0 = a (ranks 0-3), n1 = b (ranks 4-7)"
    crossing = grid_picture(ProcessGrid(1, 1, 8), TWO_NODES)
    assert "[ 0  1  2  3 |  4  5  6  7]  n0|n1" in crossing
    one_host = grid_picture(grid, NodeMap(("a",) * 8))
    assert one_host == grid_picture(grid) and "nodes:" not in one_host


def test_the_host_name_override(monkeypatch):
    monkeypatch.setenv("HYBRID_ENGINE_HOST", "node-7")
    assert host_name() == "node-7"
    monkeypatch.delenv("HYBRID_ENGINE_HOST")
    assert host_name() and host_name() != "node-7"
