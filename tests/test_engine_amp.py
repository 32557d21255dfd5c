"""Mixed precision in the engine: an overflow on one rank is a skipped step on every rank; bf16 keeps grid
invariance within bf16 tolerance, in both half-precision implementations."""
import numpy as np
import pytest

from dist_utils import run_ranks
from engine_ranks import amp_overflow_run, train_precision

CFG = dict(dim=32, depth=4, batch_size=16, micro_batches=4, steps=5, lr=0.05)


def test_inf_on_one_rank_skips_the_step_everywhere_and_halves_the_scale():
    inject_rank, inject_step = 3, 2
    results = run_ranks(4, amp_overflow_run, 1, 2, 2, CFG, inject_rank, inject_step, timeout=120)
    histories = [r["history"] for r in results]
    assert all(h == histories[0] for h in histories), "ranks disagree on the scale history"
    used, skipped, after = zip(*histories[0])
    assert skipped == (False, False, True, False, False)
    assert used[inject_step] == 65536.0 and after[inject_step] == 32768.0
    assert used[inject_step + 1] == 32768.0  # later steps proceed at the halved scale
    for r in results:
        before, after_step = r["states"]["before"], r["states"]["after"]
        for key, value in before.items():
            assert np.array_equal(value, after_step[key]), f"{key} changed in a skipped step"


@pytest.mark.parametrize("impl", ["autocast", "half-weights"])
def test_bf16_grids_match_one_rank_within_bf16_tolerance(impl):
    one = run_ranks(1, train_precision, [(1, 1, 1, "1f1b")], CFG, "bf16", impl, timeout=120)[0][0]
    runs = [(1, 2, 2, "1f1b"), (2, 2, 1, "zb1"), (1, 4, 1, "gpipe"), (4, 1, 1, "1f1b")]
    curves = run_ranks(4, train_precision, runs, CFG, "bf16", impl, timeout=180)[0]
    for run, curve in zip(runs, curves):
        assert curve == pytest.approx(one, rel=2e-2), run
