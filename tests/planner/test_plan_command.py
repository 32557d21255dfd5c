"""python -m hybrid_engine.plan and the driver's --plan-only: a ranked table, exit 0, no training."""
from __future__ import annotations

import re

from hybrid_engine import plan
from hybrid_engine.train import cli


def test_plan_command_ranks_every_grid_of_the_world(capsys):
    assert plan.main(["--world-size", "4", "--dim", "8192", "--depth", "16", "--batch-size", "1024", "--amp",
                      "bf16", "--plan-card", "h200"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:4].strip().isdigit()]
    assert len(rows) == 6  # 4x1x1 1x4x1 1x1x4 2x2x1 2x1x2 1x2x2
    times = [float(re.search(r"\s([\d.e+]+)\s+[\d.e+]+\s+[\d.]+(\s|$)", line).group(1)) for line in rows]
    assert times == sorted(times) and "why not" in out[1]
    assert all(line.split()[1].count("x") == 2 for line in rows)
    assert any("bubble" in line or "all-reduces" in line or "exposed" in line for line in rows[1:])


def test_plan_command_bad_world_size_is_one_line(capsys):
    assert plan.main(["--world-size", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_plan_only_exits_0_without_training(capsys):
    assert cli.main(["--plan-only", "--pp", "2", "--dim", "64", "--depth", "4", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "plans for 2 ranks" in out and "step " not in out.replace("ms/step", "")
