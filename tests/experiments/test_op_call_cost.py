"""experiments/bench/op_call_cost.py times the layer function's call on this tree: three positive per-call times,
the operator's with and without a GradBuffer beside F.linear."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_op_call_cost_prints_three_positive_times():
    out = subprocess.run([sys.executable, "experiments/bench/op_call_cost.py"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    times = json.loads(out.strip().splitlines()[-1])
    assert set(times) == {"ops.linear with a GradBuffer", "ops.linear without", "F.linear"}
    assert all(t > 0 for t in times.values())
