"""experiments/passes/zero_sharding_pass.sh refuses what it does not take in one line (exit 2) before it builds or
launches anything; `SMOKE=1` runs its tiny CPU shape (by hand: ~1 minute of four 2-rank launches)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "passes" / "zero_sharding_pass.sh"


@pytest.mark.parametrize("env,args,said", [
    ({"SMOKE": "2"}, [], "SMOKE must be 0 or 1, got 2"),
    ({"SMOKE": "1"}, ["--zero", "3"],
     "zero_sharding_pass.sh takes no arguments (settings: SMOKE, PASS_BUDGET_S, OUT), got --zero"),
    ({"SMOKE": "1", "PEERS": "fsdp2 titan"}, [], "PEERS takes fsdp2, torchtitan, 0 or 1, got titan"),
])
def test_bad_settings_are_one_line_and_exit_2(env, args, said, tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), *args], env=dict(os.environ, OUT=str(tmp_path), **env),
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert run.stdout.strip() == said, run.stdout
    assert not list(tmp_path.iterdir())  # nothing written, nothing run


def test_only_the_compiled_torchtitan_run_asked_for_reads_no_eager_log(tmp_path):
    """PEER_RUNS="compile": no eager torchtitan run, so nothing of its log is read (the compiled run itself is for
    GPUs: the smoke runs neither). A torchtitan stands in, importable, so that the pass reaches its runs."""
    fake = tmp_path / "site" / "torchtitan"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    out = tmp_path / "out"
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, SMOKE="1", LEVELS=" ", PEERS="torchtitan", PEER_RUNS="compile",
                                  OUT=str(out), PYTHON=sys.executable, PYTHONPATH=str(tmp_path / "site")))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "No such file" not in run.stderr and "torchtitan_eager.log" not in run.stderr, run.stderr
    # nor is a log of an eager run of an earlier call (the smoke keeps its logs in one folder) taken for this one's
    assert "torchtitan_compile not run" not in run.stdout, run.stdout
    assert "torchtitan is not installed" not in run.stdout  # the stand-in was found: the runs' branch was taken
    assert not any(line.startswith(("torchtitan_eager", "torchtitan_compile")) for line in run.stdout.splitlines())
    assert (out / "zero_sharding.json").exists()
