"""experiments/bench/fp8_linear_bench.py runs its code on this tree (the CPU's emulated path; its times are the
GPU's to give): one JSON line a recipe with every part timed, the quantization a micro-batch the sum of x's, dy's
and the weight's share. experiments/bench/fp8_cast_bench.py (Triton's kernels only) refuses elsewhere in one line."""
import json
import os
import subprocess
import sys

import pytest

from hybrid_engine.kernels.options import has_triton

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_fp8_linear_bench_times_every_part_of_both_recipes():
    out = subprocess.run([sys.executable, "experiments/bench/fp8_linear_bench.py", "--device", "cpu", "--m", "64",
                          "--k", "32", "--n", "48", "--iters", "2", "--warmup", "1", "--micro-batches", "4"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=True).stdout
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["recipe"] for r in results] == ["tensorwise", "rowwise"]
    for r in results:
        ms = r["ms"]
        assert len(ms) == 11 and all(v > 0 for v in ms.values()) and not r["native"]
        share = ms["quantize x (both layouts)"] + ms["quantize dy (both layouts)"] + ms["quantize w (both layouts)"] / 4
        assert abs(r["quantize_ms_per_micro_batch"] - share) < 1e-3


@pytest.mark.skipif(has_triton(), reason="a GPU with Triton runs the bench itself")
def test_the_cast_bench_says_in_one_line_that_it_needs_a_gpu_with_triton():
    done = subprocess.run([sys.executable, "experiments/bench/fp8_cast_bench.py", "--shapes", "64x32"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "CUDA GPU with Triton" in done.stderr
