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
    # 4x1x1 1x4x1 1x1x4 2x2x1 2x1x2 1x2x2, and the three with DP ranks again under each other ZeRO level (1-3)
    assert len(rows) == 15 and len({line.split()[1] for line in rows}) == 6
    for level in "123":
        assert sorted(line.split()[1] for line in rows if line.split()[2] == level) == ["2x1x2", "2x2x1", "4x1x1"]
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
    # every number goes through one formatter, whatever the world: 4 ranks rank half the grids 8 would
    for card, per in (("cpu", "GiB/rank"), ("h100", "GiB/GPU")):
        assert plan.main(["--world-size", "4", "--model", "gpt", "--batch-size", "1024", "--plan-card", card]) == 0
        out = capsys.readouterr().out
        assert per in out.splitlines()[1] and ("GiB/GPU" in out) == (per == "GiB/GPU")
        assert not re.search(r"\de[+-]\d", out), out


def test_grids_are_the_divisor_triples_found_without_world_squared_work():
    assert sorted(grids.grids_of(12)) == sorted((12 // (p * m), p, m) for p in range(1, 13) for m in range(1, 13)
                                                 if 12 % (p * m) == 0)
    assert len(grids.grids_of(2**16)) == 17 * 18 // 2
    assert grids.divisors(2**31 - 1) == [1, 2**31 - 1]  # a prime: sqrt(n) steps, not n


@pytest.mark.parametrize("module, argv", [  # stdout is gone before any line, whatever the work: a small one
    ("hybrid_engine.plan", ["--world-size", "2", "--model", "gpt"]),
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


LLAMA_8B = ["--model", "llama", "--hidden", "4096", "--layers", "32", "--heads", "32", "--kv-heads", "8",
            "--ffn-hidden", "14336", "--seq-len", "4096", "--vocab-size", "128256", "--batch-size", "16", "--amp",
            "bf16", "--optimizer", "adamw"]


def test_a_gpu_card_is_planned_from_a_cpu_machine_with_its_memory_and_fp16(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    # this machine's RAM is not the card's: the 8B's 30 GiB of fp32 weights on one rank are the planner's to judge
    monkeypatch.setattr("hybrid_engine.models.memory_estimate.memory_bytes", lambda device_type="cpu": 2**30)
    assert plan.main(["--world-size", "4", *LLAMA_8B, "--plan-card", "h100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plans for 4 ranks of H100 (79.1 GiB each, a plan may need 76.7 ")
    rows = {(line.split()[1], line.split()[2]): line for line in out if line[:4].strip() in ("-", *"0123456789")}
    # dp4 under ZeRO-1 needs more than the card, in numbers; the rows that fit give their peak under the cap
    assert re.search(r"no plan fits 79\.1 GiB per rank: the smallest, .*, needs 8\d\.\d GiB \(9\d\.\d with the "
                     r"allocator's overhead, 76\.7 usable\)", rows[("4x1x1", "1")]), rows[("4x1x1", "1")]
    fitted = [line for line in rows.values() if line.split()[0].isdigit()]
    peaks = [float(re.search(r"(\d+\.\d)(  \+|$)", line.rstrip()).group(1)) for line in fitted]
    assert fitted and all(peak <= 76.7 for peak in peaks), peaks
    for line in fitted[1:]:  # each loser: how much slower, against what, and why
        assert re.search(r"\+\d+% \([\d.]+ against [\d.]+ ms\): ", line), line
    assert plan.main(["--world-size", "2", "--dim", "256", "--depth", "4", "--batch-size", "64", "--amp", "fp16",
                      "--plan-card", "h200"]) == 0
    assert "run the first: torchrun --nproc_per_node=2 " in capsys.readouterr().out


def test_the_winners_zero_level_is_on_its_command_line_and_a_given_zero_is_kept(capsys):
    argv = ["--world-size", "2", "--dim", "1024", "--depth", "8", "--batch-size", "256", "--plan-card", "h100"]
    assert plan.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:4].strip().isdigit()]
    assert {line.split()[2] for line in rows if line.split()[1] == "2x1x1"} == {"0", "1", "2", "3"}
    command = shlex.split(out[-1].split(" hybrid_engine.py ", 1)[1])
    cfg = cli.parse_config(command)
    first = rows[0].split()
    assert (str(cfg.data_parallel.zero), f"{cfg.parallel.dp}x{cfg.parallel.pp}x{cfg.parallel.mp}") == (first[2],
                                                                                                         first[1])
    assert plan.main(argv + ["--zero", "0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:4].strip().isdigit()]
    assert {line.split()[2] for line in rows} == {"0"}
