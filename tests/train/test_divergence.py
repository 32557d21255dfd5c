"""The divergence guard (hybrid_engine/train/divergence.py): a loss that is not finite or a spike stops training, and
only a state whose own step passed it may become `latest`."""
import math

from hybrid_engine.train.divergence import DivergenceGuard


def test_a_non_finite_loss_is_named():
    guard = DivergenceGuard()
    assert guard.problem(3, math.nan) == "loss is NaN at step 3"
    assert guard.problem(3, math.inf) == "loss is inf at step 3"


def test_a_spike_is_a_loss_over_factor_times_the_largest_of_the_recent_ones():
    guard = DivergenceGuard(factor=10.0, window=3)
    assert guard.problem(0, 5.0) is None  # no history: only finiteness is judged
    for loss in (5.0, 0.5, 0.4):
        guard.accept(loss)
    assert guard.problem(3, 49.0) is None  # falling losses: measured against the largest of the window (5.0)
    guard.accept(0.3)  # 5.0 leaves the window of 3
    assert guard.problem(4, 4.9) is None
    assert guard.problem(4, 5.1) == "loss 5.1 at step 4 is more than 10x the largest of the 3 before it (0.5): a spike"


def test_spike_factor_0_judges_finiteness_only():
    guard = DivergenceGuard(factor=0.0)
    guard.accept(1e-3)
    assert guard.problem(1, 1e30) is None and guard.problem(1, math.nan) == "loss is NaN at step 1"
