"""The driver's grid: the order flag changes the printed mapping, and a bad grid is rejected everywhere, said once.
(The default mapping on 8 ranks, by host, is tests/test_cluster_launch.py's.)"""
import re

from launch_utils import torchrun


def _table(stdout: str) -> dict[int, tuple[int, int, int]]:
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+cpu$", stdout, flags=re.M)
    return {int(r): (int(dp), int(pp), int(mp)) for r, dp, pp, mp in rows}


def test_order_flag_changes_the_mapping_as_documented():
    run = torchrun(8, "--dp", "2", "--pp", "2", "--mp", "2", "--order", "dp-mp-pp", "--steps", "0")
    assert run.returncode == 0, run.stderr
    table = _table(run.stdout)
    # dp fastest: ranks 0 and 1 are the two replicas of the same (pp 0, mp 0) shard
    assert table[0] == (0, 0, 0) and table[1] == (1, 0, 0) and table[2] == (0, 0, 1)
    assert table[4] == (0, 1, 0)


def test_bad_grid_fails_every_rank_fast_with_one_line():
    # the timeout only catches a hang: below the default --comm-timeout (60 s) a rank waiting in a collective takes.
    # Four ranks: three that must stay silent while rank 0 speaks, at half the start-up of eight
    run = torchrun(4, "--dp", "3", "--pp", "2", "--mp", "2", timeout=50)
    assert run.returncode != 0
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("hybrid_engine: error:")]
    assert len(lines) == 1, run.stderr  # every rank found it alike: printed once
    assert all("3 x 2 x 2 = 12 != world size 4" in ln for ln in lines)
    # our ranks print no traceback of their own (torchrun adds its own failure summary afterwards)
    assert "hybrid_engine.py\", line" not in run.stderr
