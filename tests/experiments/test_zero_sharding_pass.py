"""experiments/passes/zero_sharding_pass.sh refuses what it does not take in one line (exit 2) before it builds or
launches anything; `SMOKE=1` runs its tiny CPU shape (by hand: ~1 minute of four 2-rank launches)."""
import os
import subprocess
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
