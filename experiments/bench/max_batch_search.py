"""The max-batch search (experiments/bench/max_batch.py runs it on driver trials; the tests on fake ones).

Each trial costs ~20 s (mostly process start-up), so the search is built to need few. Peak memory is linear in
the batch, peak = a + b * batch, so:
  1. a small batch (--start) gives a (the fixed memory: weights, gradients, optimizer);
  2. a batch at --spread (0.4) x the predicted maximum gives a well-measured slope b: the prediction comes from
     the memory model (memory_model.py) until two measured points exist, then from the least-squares line through every
     passing trial's peak; a line whose points span less than 0.15 x its own prediction gets another point;
  3. the line meets the memory the process may use (--capacity-gib; default the driver's --memory-cap-gib, else
     the GPU's size) at the predicted maximum P: the next trial is just below it, --aim (0.97) x P; then one
     just above the last pass (x (1 + tolerance): a failure there closes the bracket), or just below the
     last failure (/ (1 + tolerance): a pass there closes it); steps grow after two moves the same way, never
     past the middle of the bracket, and a bracket of <= 2 x tolerance is split in the middle;
  4. stop when (first failure - max pass) <= --tolerance (3%) x max pass, at --cap, on an error, or when the
     next round would end past the mode's --time-budget (the answer is then the bracket so far, "converged":
     false). A typical search: 4 trials (start, slope point, 0.97 P pass, 1.0 P fail).

Pure planning: plan_next and plan_round are functions of the trials so far; search_max_batch runs the rounds.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

TOO_BIG = ("oom", "timeout")  # outcomes that mean "this batch does not fit"
CONDITIONED = 0.15  # a line is trusted once its points span this share of its own predicted maximum


@dataclass
class Trial:
    batch: int
    # ok | oom | timeout (too slow: counts as too big) | budget (cut by --time-budget) | transient (the launcher
    # failed: run again on a new port) | error
    status: str
    peak_gib: Optional[float] = None  # the largest per-rank peak (torch.cuda.max_memory_allocated)
    seconds: float = 0.0
    message: str = ""


@dataclass
class Search:
    max_batch: Optional[int]  # the largest batch that passed
    first_failure: Optional[int]  # the smallest batch above it that failed
    converged: bool
    reason: str
    trials: list[Trial] = field(default_factory=list)
    fit: Optional[dict] = None  # {"a_gib", "b_gib_per_row", "points"}: peak = a + b * batch, least squares
    predicted_max: Optional[int] = None  # where that line meets the capacity


@dataclass(frozen=True)
class Plan:
    """What the planner knows besides the trials."""
    quantum: int
    start: int
    cap: int
    tolerance: float = 0.03
    capacity_gib: Optional[float] = None  # memory one process may allocate
    row_gib_hint: Optional[float] = None  # the memory model's slope (GiB per batch row), before any is measured
    fixed_gib_hint: Optional[float] = None  # the memory model's fixed memory
    aim: float = 0.97  # the first trial near the limit: this x the predicted maximum
    spread: float = 0.4  # the slope point: this x the predicted maximum


def round_down(x: float, quantum: int) -> int:
    return max(quantum, int(x) // quantum * quantum)


def round_up(x: float, quantum: int) -> int:
    return max(quantum, -(-int(math.ceil(x)) // quantum) * quantum)


def fit_line(trials: list[Trial]) -> Optional[tuple[float, float, int, int]]:
    """(a, b, span, points): least squares peak = a + b * batch over the passing trials with a peak (repeats
    of a batch averaged); span = largest - smallest batch. None below two distinct batches."""
    by_batch: dict[int, list[float]] = {}
    for t in trials:
        if t.status == "ok" and t.peak_gib:
            by_batch.setdefault(t.batch, []).append(t.peak_gib)
    if len(by_batch) < 2:
        return None
    xs = list(by_batch)
    ys = [sum(v) / len(v) for v in by_batch.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b, max(xs) - min(xs), len(xs)


def predict(trials: list[Trial], capacity_gib: Optional[float]) -> Optional[float]:
    """The batch at which the least-squares line through the passing trials' peaks reaches capacity_gib."""
    line = fit_line(trials)
    if capacity_gib is None or line is None or line[1] <= 0:
        return None
    a, b, _, _ = line
    return (capacity_gib - a) / b


def bounds(trials: list[Trial]) -> tuple[Optional[int], Optional[int]]:
    """(largest passing batch, smallest failing batch above it)."""
    passed = [t.batch for t in trials if t.status == "ok"]
    lo = max(passed) if passed else None
    failed = [t.batch for t in trials if t.status in TOO_BIG and (lo is None or t.batch > lo)]
    return lo, min(failed) if failed else None


def finished(trials: list[Trial], c: Plan) -> Optional[str]:
    lo, hi = bounds(trials)
    cap = round_down(c.cap, c.quantum)
    if lo is not None and hi is not None and hi - lo <= max(c.quantum, c.tolerance * lo):
        return f"bracket within {c.tolerance:.0%}"
    if hi is None and lo is not None and lo >= cap:
        return f"reached the cap ({cap}): the true limit is higher"
    if lo is None and hi is not None and hi <= c.quantum:
        return f"even batch {c.quantum} fails"
    return None


def _peak_of(trials: list[Trial], batch: int) -> Optional[float]:
    return next((t.peak_gib for t in reversed(trials) if t.batch == batch and t.status == "ok" and t.peak_gib), None)


def _estimate(trials: list[Trial], c: Plan, lo: int) -> tuple[Optional[float], bool]:
    """(predicted maximum, whether it comes from a well-conditioned measured line)."""
    line = fit_line(trials)
    pred = predict(trials, c.capacity_gib)
    if pred is not None and line[2] >= CONDITIONED * pred:
        return pred, True
    if pred is not None:
        return pred, False
    peak = _peak_of(trials, lo)
    if c.capacity_gib and c.row_gib_hint and peak:  # the model's slope from the measured point
        return lo + (c.capacity_gib - peak) / c.row_gib_hint, False
    return None, False


def plan_next(trials: list[Trial], c: Plan) -> Optional[int]:
    """The next batch to try (None: nothing left to learn). Pure: a function of the trials so far."""
    q, tol = c.quantum, c.tolerance
    cap = round_down(c.cap, q)
    considered = [t for t in trials if t.status == "ok" or t.status in TOO_BIG]
    tested = {t.batch for t in considered}
    lo, hi = bounds(considered)
    if finished(considered, c):
        return None
    if lo is None and hi is None:
        return min(round_down(c.start, q), cap)

    def inside(x: int, step: int) -> Optional[int]:  # x, moved by `step` past tested batches, within (lo, hi)
        x = max(q, min(x, cap))
        while x in tested:
            x += step
        ok = (lo is None or x > lo) and (hi is None or x < hi) and q <= x <= cap
        return x if ok else None

    if lo is None:  # everything failed so far: halve
        return inside(round_down(hi // 2, q), -q)
    mid = round_down((lo + hi) // 2, q) if hi is not None else None
    est, conditioned = _estimate(considered, c, lo)
    if est is None:  # nothing to aim with (no capacity, no peaks): grow geometrically, then bisect
        return inside(min(4 * lo, cap), q) if hi is None else inside(mid, q)
    if hi is not None:
        est = min(est, hi)
    if not conditioned:
        x = round_down(c.spread * est, q)
        if x >= 1.5 * lo:  # the slope point: far enough above the small start to measure the slope well
            return inside(x, q)
        low = min(t.batch for t in considered if t.status == "ok")
        if fit_line(considered) is None or low > CONDITIONED * est:  # passes only near the limit: one far below
            below = round_down(c.spread * low, q)
            if below < low and below not in tested:
                return below
    # near the limit: jump to just below the prediction, then step across it
    if hi is not None and hi - lo <= 2 * tol * lo:  # one trial in the middle closes the bracket either way
        return inside(mid, q) or inside(mid, -q)
    target = round_down(c.aim * est, q)
    step_up = max(lo + q, round_down(lo * (1 + tol), q))
    if target >= step_up and (hi is None or target < hi) and target not in tested:
        return min(target, cap)
    outcome = "ok" if considered[-1].status == "ok" else "fail"
    streak = 0
    for t in reversed(considered):
        if ("ok" if t.status == "ok" else "fail") != outcome or (outcome == "ok" and t.batch < 0.8 * est):
            break
        streak += 1
    j = 1 if streak <= 2 else 2 ** (streak - 2)  # after two moves the same way, steps grow
    if outcome == "ok" or hi is None:
        x = max(lo + q, round_down(lo * (1 + tol) ** (j if outcome == "ok" else 1), q))
        return inside(min(x, mid) if mid is not None else x, q)
    x = min(hi - q, round_up(hi / (1 + tol) ** j, q))
    return inside(max(x, mid), -q)


def _line_peak(trials: list[Trial], c: Plan, batch: int) -> Optional[float]:
    line = fit_line(trials)
    if line is not None and line[1] > 0:
        return line[0] + line[1] * batch
    if c.row_gib_hint is None:
        return None
    low = [t for t in trials if t.status == "ok" and t.peak_gib]
    if low:  # the model's slope through the smallest measured point
        t = min(low, key=lambda t: t.batch)
        return t.peak_gib + c.row_gib_hint * (batch - t.batch)
    return (c.fixed_gib_hint or 0.0) + c.row_gib_hint * batch


def plan_round(trials: list[Trial], c: Plan, width: int = 1) -> list[int]:
    """The batches of the next round: plan_next's, and with width 2 also the one it would pick next if that
    trial went as the line (or the model) predicts, else the one for the other outcome."""
    first = plan_next(trials, c)
    if first is None:
        return []
    batches = [first]
    if width > 1:
        peak = _line_peak(trials, c, first)
        likely_ok = peak is None or c.capacity_gib is None or peak <= c.capacity_gib
        for ok in (likely_ok, not likely_ok):
            guess = Trial(first, "ok" if ok else "oom", peak_gib=peak if ok else None)
            second = plan_next(trials + [guess], c)
            if second is not None and second != first:
                batches.append(second)
                break
    return batches


def search_max_batch(trial: Callable[[int], Trial], *, quantum: int, start: int, cap: int, tolerance: float = 0.03,
                     budget_s: float = math.inf, capacity_gib: Optional[float] = None,
                     row_gib_hint: Optional[float] = None, fixed_gib_hint: Optional[float] = None, width: int = 1,
                     aim: float = 0.97, clock: Callable[[], float] = time.monotonic) -> Search:
    """Largest multiple of `quantum` in [quantum, cap] for which trial(batch).status == "ok" (memory grows with
    the batch, so pass/fail is monotonic). Stops when the bracket is within max(quantum, tolerance * best),
    at the cap, on an error trial, or when the next round would likely end past `budget_s`. A "transient"
    trial is run once more (the trial function picks a new port); twice in a row is an error.
    width 2: two trials per round, run side by side (plan_round)."""
    c = Plan(quantum=quantum, start=start, cap=cap, tolerance=tolerance, capacity_gib=capacity_gib,
             row_gib_hint=row_gib_hint, fixed_gib_hint=fixed_gib_hint, aim=aim)
    began = clock()
    trials: list[Trial] = []
    longest = 0.0
    pool = ThreadPoolExecutor(max_workers=width) if width > 1 else None

    def done(converged: bool, reason: str) -> Search:
        if pool is not None:
            pool.shutdown(wait=True)
        lo, hi = bounds(trials)
        line = fit_line(trials)
        pred = predict(trials, capacity_gib)
        fit = None if line is None else {"a_gib": round(line[0], 4), "b_gib_per_row": line[1], "points": line[3]}
        return Search(lo, hi, converged, reason, trials, fit, None if pred is None else int(pred))

    def attempt(batch: int) -> list[Trial]:
        first = trial(batch)
        if first.status != "transient":
            return [first]
        again = trial(batch)
        if again.status == "transient":
            again.status = "error"
            again.message = f"launcher failed twice: {again.message}"
        return [first, again]

    while True:
        reason = finished(trials, c)
        if reason:
            return done(True, reason)
        batches = plan_round(trials, c, width)
        if not batches:
            return done(True, "no untested batch left")
        if trials and clock() - began + longest > budget_s:
            return done(False, "time budget spent")
        rounds = list(pool.map(attempt, batches)) if pool is not None else [attempt(b) for b in batches]
        for results in rounds:
            trials.extend(results)
            longest = max([longest] + [r.seconds for r in results])
        for r in (results[-1] for results in rounds):
            if r.status == "error":
                return done(False, f"trial at batch {r.batch} failed: {r.message}")
        if any(results[-1].status == "budget" for results in rounds):
            return done(False, "time budget spent")
