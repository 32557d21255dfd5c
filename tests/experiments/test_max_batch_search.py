"""The max-batch search (experiments/bench/max_batch_search.py) on fake trial runners, no processes: it brackets
the limit within its tolerance, jumps near it along the measured memory line, stops at the cap, on errors and when
its budget is spent, and retries a launcher failure once."""
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
sys.path.insert(0, str(EXPERIMENTS / "bench"))

import max_batch  # noqa: E402
import max_batch_search  # noqa: E402


def fake_trials(limit: int, *, gib_per_row: float | None = None, seconds: float = 1.0):
    calls = []

    def trial(batch):
        calls.append(batch)
        peak = 2.0 + gib_per_row * batch if gib_per_row else None
        return max_batch.Trial(batch, "ok" if batch <= limit else "oom", peak_gib=peak, seconds=seconds)
    return trial, calls


@pytest.mark.parametrize("limit", [8, 1000, 12_344, 300_000])
def test_max_batch_search_brackets_the_limit_within_tolerance(limit):
    trial, calls = fake_trials(limit)
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**20, tolerance=0.05)
    assert found.converged and found.max_batch <= limit < found.first_failure
    assert found.first_failure - found.max_batch <= max(8, 0.05 * found.max_batch)
    assert all(b % 8 == 0 for b in calls) and len(calls) <= 20


def test_max_batch_search_uses_the_memory_line_to_jump_near_the_limit():
    # 80 GiB card, 2 GiB fixed, limit where the line reaches ~76 GiB (the rest: context, fragmentation)
    trial, calls = fake_trials(limit=296_000, gib_per_row=0.00025)
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**20, tolerance=0.05, capacity_gib=80.0)
    blind, blind_calls = fake_trials(limit=296_000)
    max_batch.search_max_batch(blind, quantum=8, start=1024, cap=2**20, tolerance=0.05)
    assert found.max_batch <= 296_000 < found.first_failure
    assert len(calls) < len(blind_calls)


def test_max_batch_search_stops_at_the_cap_on_errors_and_when_the_budget_is_spent():
    trial, _ = fake_trials(10**9)
    capped = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=5003, tolerance=0.05)
    assert capped.max_batch == 5000 and capped.first_failure is None and "cap" in capped.reason

    broken = max_batch.search_max_batch(lambda b: max_batch.Trial(b, "error", message="boom"), quantum=8,
                                        start=1024, cap=2**20)
    assert not broken.converged and broken.max_batch is None and "boom" in broken.reason

    cut = max_batch.search_max_batch(lambda b: max_batch.Trial(b, "ok" if b <= 4096 else "budget"), quantum=8,
                                     start=1024, cap=2**20)  # no capacity known: x4 growth, 1024 -> 4096 -> 16384
    assert (cut.max_batch, cut.first_failure, cut.reason) == (4096, None, "time budget spent")

    clock = iter(range(0, 10**6, 100))  # every look at the clock: 100 s later
    slow, calls = fake_trials(10**6, seconds=100.0)
    out = max_batch.search_max_batch(slow, quantum=8, start=1024, cap=2**20, budget_s=450, clock=lambda: next(clock))
    assert not out.converged and out.reason == "time budget spent" and len(calls) == 4


def linear_memory(a: float, b: float, capacity: float, *, frag: float = 0.0, noise: float = 0.003, seed: int = 0,
                  transient: tuple[int, ...] = ()):
    """A fake trial runner: peak = a + b * batch (+ Gaussian noise on the reported peak, rounded like the driver's
    records); out of memory where the true peak passes (1 - frag) x capacity (fragmentation, context); the
    calls numbered in `transient` (1-based) fail like a port clash instead."""
    rng = random.Random(seed)
    calls = []

    def trial(batch):
        calls.append(batch)
        if len(calls) in transient:
            return max_batch.Trial(batch, "transient", seconds=4.6, message="exit 1: DistNetworkError: EADDRINUSE")
        peak = a + b * batch
        if peak > capacity * (1 - frag):
            return max_batch.Trial(batch, "oom", seconds=20.0)
        return max_batch.Trial(batch, "ok", peak_gib=round(peak + rng.gauss(0, noise), 3), seconds=20.0)

    def limit(quantum=8):  # the true largest passing batch
        return int((capacity * (1 - frag) - a) / b) // quantum * quantum
    return trial, calls, limit()


KB = 1e3 / 2**30  # GiB per KB
SETTINGS = [  # (a GiB, b GiB per row, capacity GiB): 8 GiB caps at the shapes of the GPU run, 80 and 140 GiB cards
    (2.06, 55.3 * KB, 8.0), (1.8, 27.6 * KB, 8.0), (1.8, 26.6 * KB, 8.0), (2.0, 0.00025, 80.0),
    (20.0, 1e-4, 139.8), (0.5, 2e-6, 8.0), (3.0, 300 * KB, 8.0)]


@pytest.mark.parametrize("a,b,capacity", SETTINGS)
@pytest.mark.parametrize("frag", [0.0, 0.02])
@pytest.mark.parametrize("hint_error", [0.5, 1.0, 2.0])  # the memory model's slope, off by this factor
def test_max_batch_search_converges_within_3_percent_in_at_most_6_trials(a, b, capacity, frag, hint_error):
    for seed in range(3):
        trial, calls, limit = linear_memory(a, b, capacity, frag=frag, seed=seed)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, tolerance=0.03,
                                           capacity_gib=capacity, row_gib_hint=b * hint_error,
                                           fixed_gib_hint=0.8 * a)
        assert found.converged and found.max_batch <= limit < found.first_failure, (calls, limit)
        assert found.first_failure - found.max_batch <= max(8, 0.03 * found.max_batch)
        assert len(calls) <= 6, (calls, limit)
        assert all(x % 8 == 0 for x in calls) and len(set(calls)) == len(calls)
        # the result carries the fitted line and its prediction
        assert found.fit["b_gib_per_row"] == pytest.approx(b, rel=0.03) and found.fit["points"] >= 2
        assert found.fit["a_gib"] == pytest.approx(a, abs=0.05)
        assert found.predicted_max == pytest.approx((capacity - a) / b, rel=0.03)


def test_max_batch_search_without_the_model_still_converges_and_the_old_run_would_have():
    # the 2026-11-26 run: 8 GiB cap, fp32 a ~ 2.06 GiB; without any hint, and with the capacity the GPU's size
    # (the old bug: 139.8 GiB instead of the cap) the search still brackets the limit, only later
    for capacity_seen in (8.0, None):
        trial, calls, limit = linear_memory(2.06, 55.3 * KB, 8.0)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, tolerance=0.03,
                                           capacity_gib=capacity_seen)
        assert found.converged and found.max_batch <= limit < found.first_failure
        assert len(calls) <= (7 if capacity_seen else 16), calls


@pytest.mark.parametrize("a,b,capacity", SETTINGS[:4])
def test_max_batch_search_two_per_round_needs_at_most_3_rounds(a, b, capacity, monkeypatch):
    rounds = []
    plan_round = max_batch_search.plan_round
    monkeypatch.setattr(max_batch_search, "plan_round",
                        lambda *x, **k: rounds.append(plan_round(*x, **k)) or rounds[-1])
    for hint_error in (0.5, 1.0, 2.0):
        rounds.clear()
        trial, calls, limit = linear_memory(a, b, capacity, frag=0.01)
        found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=capacity,
                                           row_gib_hint=b * hint_error, fixed_gib_hint=0.8 * a, width=2)
        assert found.converged and found.max_batch <= limit < found.first_failure
        ran = [r for r in rounds if r]
        assert len(ran) <= 3 and all(len(r) <= 2 for r in ran), ran
        assert sorted(calls) == sorted(x for r in ran for x in r)


def test_max_batch_search_retries_a_transient_launcher_failure_once_on_the_same_batch():
    trial, calls, limit = linear_memory(2.06, 55.3 * KB, 8.0, transient=(2,))
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=8.0,
                                       row_gib_hint=55.3 * KB)
    assert found.converged and found.max_batch <= limit < found.first_failure
    assert calls[1] == calls[2]  # the port clash, then the same batch again
    assert [t.status for t in found.trials].count("transient") == 1 and len(calls) <= 7

    trial, calls, _ = linear_memory(2.06, 55.3 * KB, 8.0, transient=(2, 3))  # twice in a row: a real error
    found = max_batch.search_max_batch(trial, quantum=8, start=1024, cap=2**22, capacity_gib=8.0)
    assert not found.converged and "launcher failed twice" in found.reason and len(calls) == 3
    assert found.max_batch == 1024
