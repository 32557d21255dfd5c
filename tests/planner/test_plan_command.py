"""python -m hybrid_engine.plan and the driver's --plan-only: a ranked table, exit 0, no training."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from hybrid_engine import plan
from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.planner import grids
from hybrid_engine.train import cli
from launch_utils import REPO


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


def _fails_with(capsys, argv) -> str:
    assert plan.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m hybrid_engine.plan: error: "), err
    return err.strip().split("error: ", 1)[1]


def test_plan_help_lists_the_flags_planning_reads_and_no_others(capsys):
    assert plan.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--world-size", "--calibrate", "--model", "--hidden", "--batch-size", "--plan-card", "--amp",
                 "--memory-cap-gib", "--schedule", "--micro-batches", "--recompute"):
        assert f"{flag} " in text or f"{flag}\n" in text, flag
    for flag in ("--pp ", "--dp ", "--mp ", "--save ", "--steps ", "--metrics ", "--plan-only"):
        assert flag not in text, flag


def test_a_flag_planning_ignores_is_refused(capsys):
    assert _fails_with(capsys, ["--world-size", "4", "--pp", "2"]) == (
        "--pp does not apply to planning: the table ranks every dp x pp x mp of --world-size (the driver's "
        "--plan-only plans for its own flags)")
    assert _fails_with(capsys, ["--steps", "5", "--save", "ck"]).startswith("--steps, --save do not apply to planning")


def test_a_config_files_settings_that_planning_does_not_read_are_said(capsys, tmp_path):
    run = tmp_path / "run.toml"
    run.write_text("[parallel]\npp = 2\n[training]\nsteps = 50\n[data]\nbatch_size = 32\n")
    assert plan.main(["--world-size", "2", "--config", str(run)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"note: --config {run}: parallel.pp, training.steps not read by planning (the table ranks every "
                   "grid of --world-size)\n")
    assert "batch 32" in out.splitlines()[0]


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt", "--heads", "6"], "--hidden 256 is not divisible by --heads 6"),
    (["--model", "llama", "--hidden", "256", "--heads", "6"],
     "--hidden 256 is not divisible by --heads 6 (give --head-dim)"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--world-size", "1000000"], "the world size to plan for must be a number of ranks in [1, 65536], got 1000000"),
])
def test_the_planner_refuses_what_the_driver_refuses_in_one_line(capsys, argv, message):
    assert _fails_with(capsys, argv) == message
    with pytest.raises(ConfigError) as err:  # the driver's --plan-only: the same rule, the same line
        cli.main(["--plan-only", *[a for a in argv if a != "--world-size" and a != "1000000"]]
                 + (["--dp", "256", "--pp", "256", "--mp", "256"] if "1000000" in argv else []))
    assert str(err.value) == message.replace("1000000", str(256**3))


def test_the_winner_is_a_command_line_the_driver_accepts(capsys):
    argv = ["--world-size", "4", "--model", "gpt", "--hidden", "64", "--batch-size", "16", "--plan-card", "h200",
            "--amp", "bf16"]
    assert plan.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:4].strip().isdigit()]
    command = out[-1]
    assert command.startswith("run the first: torchrun --nproc_per_node=4 hybrid_engine.py --dp "), command
    flags = shlex.split(command.split(" hybrid_engine.py ", 1)[1])
    assert "--world-size" not in flags and flags[-10:] == argv[2:]
    cfg = cli.parse_config(flags)
    grid = cfg.validate(4, "cpu", registry.check_model)
    first = rows[0].split()
    assert f"{grid.dp_size}x{grid.pp_size}x{grid.mp_size}" == first[1]
    assert f"{cfg.schedule.name}, {cfg.schedule.micro_batches} micro-batch" in rows[0]


def test_every_number_is_plain_and_memory_is_per_gpu_only_for_a_gpu(capsys):
    for card, per in (("cpu", "GiB/rank"), ("h100", "GiB/GPU")):
        assert plan.main(["--world-size", "8", "--model", "gpt", "--batch-size", "1024", "--plan-card", card]) == 0
        out = capsys.readouterr().out
        assert per in out.splitlines()[1] and ("GiB/GPU" in out) == (per == "GiB/GPU")
        assert not re.search(r"\de[+-]\d", out), out


def test_grids_are_the_divisor_triples_found_without_world_squared_work():
    assert sorted(grids.grids_of(12)) == sorted((12 // (p * m), p, m) for p in range(1, 13) for m in range(1, 13)
                                                 if 12 % (p * m) == 0)
    assert len(grids.grids_of(2**16)) == 17 * 18 // 2
    assert grids.divisors(2**31 - 1) == [1, 2**31 - 1]  # a prime: sqrt(n) steps, not n


@pytest.mark.parametrize("module, argv", [
    ("hybrid_engine.plan", ["--world-size", "16", "--model", "gpt"]),
    ("hybrid_engine.schedule", ["--schedule", "1f1b", "--pp", "8", "--micro-batches", "64"]),
    ("hybrid_engine", ["--plan-only", "--pp", "4", "--depth", "8"]),
])
def test_a_reader_that_leaves_ends_the_command_quietly(module, argv):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=env)
    proc.stdout.close()  # `| head -0`: gone before the command writes its first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err
