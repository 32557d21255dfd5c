#!/usr/bin/env python3
"""Max batch finder (issue #6, item 4): the largest global batch the engine trains without running out of memory.

    python experiments/bench/max_batch.py --modes fp32,fp16,fp16-recompute [--dim 8192 --depth 16 --micro-batches 8]
    python experiments/bench/max_batch.py --print-model --dim 4096     # the memory model below, no GPU needed
    python experiments/bench/max_batch.py --modes fp16 --dp 2 --zero 1  # the distributed optimizer, 2 pipelines

For each mode (a row of MODES: driver flags), at --pp 2 (one pipeline over 2 GPUs, 1F1B by default; --dp N runs
N pipelines, pp x N GPUs, and --zero 1 shards their fp32 masters and optimizer state over them), a search over
the global batch, in multiples of the micro-batch count. Every trial is a fresh `torchrun hybrid_engine.py
... --steps 2 --warmup 0`: it passes if it exits 0 and wrote its step records, it is out of memory if it failed
and stderr says so ("out of memory", OutOfMemoryError, CUBLAS_STATUS_ALLOC_FAILED). A trial that runs past
--trial-timeout counts as too big too. A trial the launcher failed (EADDRINUSE / "address already in use",
a rendezvous error, a GPU busy in exclusive mode: launch.is_transient) runs once more on a new port; any other
failure stops that mode with the error.

The search (a few trials: each costs ~20 s, mostly process start-up). Peak memory is linear in the batch,
peak = a + b * batch, so:
  1. a small batch (--start) gives a (the fixed memory: weights, gradients, optimizer);
  2. a batch at --spread (0.4) x the predicted maximum gives a well-measured slope b: the prediction comes from
     the memory model below until two measured points exist, then from the least-squares line through every
     passing trial's peak; a line whose points span less than 0.15 x its own prediction gets another point;
  3. the line meets the memory the process may use (--capacity-gib; default the driver's --memory-cap-gib, else
     the GPU's size) at the predicted maximum P: the next trial is just below it, --aim (0.97) x P; then one
     just above the last pass (x (1 + tolerance): a failure there closes the bracket), or just below the
     last failure (/ (1 + tolerance): a pass there closes it); steps grow after two moves the same way, never
     past the middle of the bracket, and a bracket of <= 2 x tolerance is split in the middle;
  4. stop when (first failure - max pass) <= --tolerance (3%) x max pass, at --cap, on an error, or when the
     next round would end past the mode's --time-budget (the answer is then the bracket so far, "converged":
     false). A typical search: 4 trials (start, slope point, 0.97 P pass, 1.0 P fail).

--parallel N runs up to N trials at once on the same GPUs: all modes together, and with N >= 2 x modes two
batches per round per mode (the planned one and the one the planner would pick next if the first went as the
line predicts). Sound only because every trial confines itself with --memory-cap-gib (a per-process allocator
limit; peaks are per process): N x (cap + 1.5 GiB) must fit the GPU. If the GPU refuses a second process
(exclusive compute mode), the search falls back to one trial at a time.

The batch is the global batch of the driver: with fixed --micro-batches a bigger batch means bigger
micro-batches; --micro-size R instead keeps R rows per micro-batch and raises the micro-batch count with the
batch (1F1B then holds at most pp micro-batches of activations, whatever the batch).

Memory model (bytes per global batch row, per pipeline stage; memory_model() below, derivation and the table
for dim 4096 / depth 16 / pp 2 / 8 micro-batches in experiments/README.md). With D = dim, e = bytes per element
of data and activations (4 fp32, 2 with half weights), L layers per stage, m micro-batches, and phi = the share
of the batch in flight on the stage (1F1B: min(m, pp - stage) / m, i.e. 2/m on stage 0 and 1/m on the last
stage of pp=2; GPipe: 1, every micro-batch):
  data       e*D             first stage: the inputs, last stage: the targets, resident for the whole step;
                             with the driver's --stream-data each micro-batch is drawn when its forward runs:
                             phi*e*D of inputs on the first stage (they are its a_0), 1/m*e*D of targets
  stored     phi*L*e*D       the fused chain (csrc/tp/linear_chain.cpp) saves every layer's output (its input
                             a_0 is the data on stage 0, a received buffer elsewhere: + phi*e*D there);
                             with --recompute only a_0 is saved (a native stage drops its output once its send
                             is done; the engine's default)
  rebuilt    L/m*e*D         --recompute only: one micro-batch's whole chain exists again while its backward
                             runs (the forward keeps only the layer it is on)
  backward   3/m*e*D         incoming gradient, ReLU-masked gradient, gradient for the layer below
  loss       (4+e)*D/m       last stage: the C++ MSE's one fp32 difference of a micro-batch, and the output
                             gradient it computes with the loss (native stages), kept until the backward:
                             + phi*e*D, except with --recompute, where the last stage's whole forward, its loss
                             and its target's draw move into the backward (before 2026-11-26's fix: fp32 copies
                             of output and target saved, and every micro-batch's fp32 unreduced loss kept to the
                             end of the step)
`--print-model` prints the table for a shape. What bounds the ratios under 1F1B at pp=2: only 2 micro-batches
are in flight on stage 0 (1 on the last), so recompute saves at most (2 - 1) * L/m * e * D per row there and
leaves one micro-batch's rebuilt chain (L/m); with the data resident, it alone (e*D per row on each end) caps
the fp16 + recompute ratio at 13.5 D / 2 D = 6.75x. Under GPipe every micro-batch is in flight, which is
where recomputation pays: with streamed data and m = 16 the model gives ~10.7x.

Writes JSON lines to <out>/<date>-<gpus>x<card>-maxbatch.jsonl (appending, so modes run in separate commands
accumulate): {"kind": "trial", ...} per trial, {"kind": "result", ...} per mode (with the fitted line
"fit": {"a_gib", "b_gib_per_row", "points"}, "predicted_max", "capacity_gib" and the model's "model_row_bytes"),
and {"kind": "ratios", ...} over the newest result of every mode in the file, against the targets fp16 >= 2x
fp32 and fp16 + recomputation >= 8x fp32.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from launch import (DRIVER, GPU_BUSY, REPO, child_env, driver_flags, error_line, execute, free_port,  # noqa: E402
                    is_oom, is_transient, missing_flags, shown, torchrun)

MODES = {  # name -> driver flags; a flag the driver lacks skips the mode with a message
    "fp32": (),
    "fp16": ("--amp", "fp16"),
    "fp16-recompute": ("--amp", "fp16", "--recompute"),
    "bf16": ("--amp", "bf16"),
    "fp16-autocast": ("--amp", "fp16", "--amp-impl", "autocast"),
}
TARGETS = {"fp16": 2.0, "fp16-recompute": 8.0}  # x the fp32 max batch
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


# ------------------------------------------------------------------------------------------- memory model
def memory_model(*, dim: int, depth: int, pp: int, micro_batches: Optional[int], schedule: str, half: bool,
                 recompute: bool, data_half: Optional[bool] = None, streamed: bool = False, dp: int = 1,
                 zero: int = 0) -> dict:
    """Bytes per global batch row on every pipeline stage (the model of the module docstring), and the fixed
    bytes per stage (weights, gradients, fp32 masters, one gradient-sized optimizer temporary).
    micro_batches None: --micro-size (the micro-batch count grows with the batch; per-micro-batch terms are
    then fixed memory, except under GPipe, which keeps every micro-batch in flight).
    streamed: the driver's --stream-data (micro-batches drawn when their forward runs). dp: pipelines, each
    running 1/dp of the global batch's rows; zero 1: each holds 1/dp of the masters and the optimizer's
    temporary (weights and gradient buckets stay whole)."""
    e = 2 if half else 4  # activations
    ed = e if data_half is None else (2 if data_half else 4)  # data (autocast: fp32 data, half activations)
    layers = depth / pp
    per_micro = 0.0 if micro_batches is None else 1.0 / micro_batches
    stages = []
    for s in range(pp):
        first, last = s == 0, s == pp - 1
        if schedule == "gpipe":
            phi = 1.0
        else:  # 1F1B-like: stage s holds at most pp - s micro-batches between their forward and backward
            phi = 0.0 if micro_batches is None else min(micro_batches, pp - s) / micro_batches
        data = (first * phi + last * per_micro) if streamed else (first + last)
        terms = {
            "data": data * ed * dim,
            # received input (not on stage 0: the data) + the layer outputs; with recompute none of them (a
            # native stage drops its output once sent; the last stage defers its forward to the backward)
            "stored": phi * ((0 if first else 1) + (0 if recompute else layers)) * e * dim,
            "rebuilt": (layers * per_micro * e * dim) if recompute else 0.0,
            "backward": 3 * per_micro * e * dim,
            # the C++ MSE: one fp32 difference of one micro-batch; its output gradient waits for the backward,
            # except with recompute, where the last stage's forward and loss run in the backward itself
            "loss": ((4 + e) * dim * per_micro + (0 if recompute else phi * e * dim)) if last else 0.0,
        }
        stages.append({"stage": s, "row_bytes": sum(terms.values()) / dp, "terms": terms})
    params = layers * (dim * dim + dim)
    sharded = dp if zero else 1
    fixed = params * ((2 + 4 + (4 + 4) / sharded) if half else (4 + 4 + 4 / sharded))
    worst = max(stages, key=lambda st: st["row_bytes"])
    return {"stages": stages, "row_bytes": worst["row_bytes"], "bound_by_stage": worst["stage"],
            "fixed_bytes": fixed}


def mode_model(flags: tuple[str, ...], a: argparse.Namespace) -> dict:
    amp = flags[flags.index("--amp") + 1] if "--amp" in flags else "off"
    autocast = "autocast" in flags
    return memory_model(dim=a.dim, depth=a.depth, pp=a.pp, micro_batches=None if a.micro_size else a.micro_batches,
                        schedule=a.schedule, half=amp != "off", recompute="--recompute" in flags,
                        data_half=False if autocast else None,
                        streamed="--stream-data" in shlex.split(a.driver_args), dp=a.dp, zero=a.zero)


def model_table(a: argparse.Namespace) -> str:
    rows = []
    for schedule in dict.fromkeys((a.schedule, "1f1b", "gpipe")):
        shape = argparse.Namespace(**{**vars(a), "schedule": schedule})
        base = mode_model(MODES["fp32"], shape)["row_bytes"]
        for mode in ("fp32", "fp16", "fp16-recompute"):
            m = mode_model(MODES[mode], shape)
            per_stage = ", ".join(f"stage {st['stage']} {st['row_bytes'] / a.dim:.3g} D" for st in m["stages"])
            rows.append(f"{schedule:6} {mode:15} {m['row_bytes'] / 1e3:7.1f} KB/row ({per_stage}; bound by stage "
                        f"{m['bound_by_stage']}), fixed {m['fixed_bytes'] / 2**30:.2f} GiB, "
                        f"x fp32 {base / m['row_bytes']:.2f} (slopes)")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------- search
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


# ------------------------------------------------------------------------------------------------ trials
class Gate:
    """At most `limit` trials at once, over all modes; serialize() drops it to one (exclusive-mode GPUs)."""

    def __init__(self, limit: int):
        self.limit, self.active = max(1, limit), 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def slot(self):
        with self.cond:
            while self.active >= self.limit:
                self.cond.wait()
            self.active += 1
        try:
            yield
        finally:
            with self.cond:
                self.active -= 1
                self.cond.notify_all()

    def serialize(self) -> None:
        with self.cond:
            self.limit = 1


def driver_trial(a: argparse.Namespace, flags: tuple[str, ...], tmp: str, log: Callable[[dict], None],
                 mode: str, deadline: float, gate: Optional[Gate] = None) -> Callable[[int], Trial]:
    """trial(batch): one fresh torchrun of the driver at that global batch (a new port every call)."""
    gate = gate or Gate(1)
    counter = iter(range(10**9))

    def trial(batch: int) -> Trial:
        metrics = os.path.join(tmp, f"{mode}-trial{batch}-{next(counter)}.jsonl")
        micro = batch // a.micro_size if a.micro_size else a.micro_batches
        with gate.slot():
            cmd = torchrun(a.pp * a.dp, free_port()) + [
                str(a.driver), "--pp", str(a.pp), *(["--dp", str(a.dp)] if a.dp > 1 else []),
                *(["--zero", str(a.zero)] if a.zero else []), "--schedule", a.schedule, "--dim", str(a.dim), "--depth",
                str(a.depth), "--batch-size", str(batch), "--micro-batches", str(micro), "--steps", str(a.steps),
                "--warmup", "0", "--comm-timeout", "60", "--quiet", "--metrics", metrics, *flags,
                *shlex.split(a.driver_args), *(["--device", "cpu"] if a.device == "cpu" else [])]
            left = deadline - time.monotonic()  # never run past the mode's budget
            rc, _, err, seconds = execute(cmd, child_env(a.device == "cpu"), max(1.0, min(a.trial_timeout, left)))
        result = Trial(batch, "ok", seconds=round(seconds, 1))
        if rc == 0:
            lines = Path(metrics).read_text().splitlines() if Path(metrics).exists() else []
            steps = [rec for rec in map(json.loads, filter(str.strip, lines)) if "step" in rec]
            if len(steps) < a.steps:
                result.status, result.message = "error", f"exit 0 but {len(steps)} of {a.steps} step records"
            else:
                result.peak_gib = max(steps[-1]["peak_mem_gib"])
        elif rc is None and a.trial_timeout > left:
            result.status, result.message = "budget", "stopped: --time-budget spent"
        elif rc is None:
            result.status, result.message = "timeout", f"ran past --trial-timeout {a.trial_timeout:g} s"
        else:
            result.status = "oom" if is_oom(err) else "transient" if is_transient(err) else "error"
            result.message = error_line(err, rc)
            if result.status == "transient" and GPU_BUSY.search(err):
                gate.serialize()  # the GPU takes one process at a time: no more trials side by side
        log({"kind": "trial", "mode": mode, **asdict(result), "micro_batches": micro, "cmd": shown(cmd)})
        print(f"  {mode} batch {batch:>8}: {result.status:9} {result.seconds:6.1f} s"
              + (f"  peak {result.peak_gib:.3f} GiB" if result.peak_gib else "")
              + (f"  {result.message[:120]}" if result.message and result.status != "oom" else ""), flush=True)
        return result
    return trial


def ratios(results: dict[str, dict]) -> dict:
    """{mode: max batch / fp32 max batch} for the TARGETS modes, with the target and whether it is met."""
    base = (results.get("fp32") or {}).get("max_batch")
    out = {}
    for mode, goal in TARGETS.items():
        best = (results.get(mode) or {}).get("max_batch")
        value = best / base if base and best else None
        out[f"{mode}_over_fp32"] = {"value": round(value, 3) if value else None, "target": f">= {goal:g}",
                                    "met": None if value is None else value >= goal}
    return out


SHAPE_KEYS = ("dim", "depth", "pp", "dp", "zero", "schedule", "micro_batches", "micro_size", "driver_args")
SHAPE_DEFAULTS = {"dp": 1, "zero": 0}  # what a record from before --dp / --zero searched at


def newest_results(path: Path, shape: dict) -> dict[str, dict]:
    """The newest result of every mode in the file that was searched at the same model and grid shape."""
    results: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a killed run
            if (rec.get("kind") == "result" and rec.get("max_batch")
                    and all(rec.get(k, SHAPE_DEFAULTS.get(k)) == shape.get(k) for k in SHAPE_KEYS)):
                results[rec["mode"]] = rec
    return results


def card_info(device: str) -> dict:
    if device == "cpu":
        return {"card": "cpu", "gpus": 2, "gpu_memory_gib": None}
    out = subprocess.run([sys.executable, str(HERE / "probe_card.py"), "--info-only"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"max_batch.py: error: probe_card.py failed: {error_line(out.stderr, out.returncode)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory_cap(driver_args: str) -> Optional[float]:
    """The --memory-cap-gib value in the driver flags, if any."""
    words = shlex.split(driver_args)
    for i, w in enumerate(words):
        if w == "--memory-cap-gib" and i + 1 < len(words):
            return float(words[i + 1])
        if w.startswith("--memory-cap-gib="):
            return float(w.split("=", 1)[1])
    return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--modes", default="fp32,fp16,fp16-recompute", help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=1, help="pipelines (data-parallel replicas): pp x dp GPUs per trial")
    p.add_argument("--zero", type=int, choices=(0, 1), default=0,
                   help="1: the distributed optimizer, masters and optimizer state sharded over the --dp pipelines")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--micro-batches", type=int, default=8, help="fixed micro-batch count (the batch quantum)")
    p.add_argument("--micro-size", type=int, default=None,
                   help="instead: fixed rows per micro-batch, micro-batches = batch / rows")
    p.add_argument("--start", type=int, default=1024, help="first batch tried (small: it measures the fixed memory)")
    p.add_argument("--cap", type=int, default=2**22, help="largest batch tried")
    p.add_argument("--tolerance", type=float, default=0.03, help="stop when (fail - pass) <= this x pass")
    p.add_argument("--aim", type=float, default=0.97, help="first trial near the limit at this x the prediction")
    p.add_argument("--capacity-gib", type=float, default=None,
                   help="memory one trial may allocate (default: --memory-cap-gib of --driver-args, else the GPU's)")
    p.add_argument("--no-model-hint", action="store_true",
                   help="do not use the memory model's slope before two trials have measured one")
    p.add_argument("--steps", type=int, default=2, help="steps per trial")
    p.add_argument("--trial-timeout", type=float, default=240.0, help="seconds one trial may take")
    p.add_argument("--time-budget", type=float, default=540.0,
                   help="seconds per mode (from the mode's start; with --parallel the modes run together)")
    p.add_argument("--parallel", type=int, default=1,
                   help="trials at once over all modes (needs --memory-cap-gib in --driver-args on a GPU): the "
                        "modes run together, and with >= 2 x modes two batches per round per mode")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto", help="cpu: gloo ranks (tests)")
    p.add_argument("--driver", type=Path, default=DRIVER, help=argparse.SUPPRESS)  # tests substitute a fake
    p.add_argument("--out", type=Path, default=HERE.parent / "results")
    p.add_argument("--driver-args", default="",
                   help="more driver flags for every trial, e.g. \"--memory-cap-gib 8\" (a smaller card: quicker trials)")
    p.add_argument("--print-model", action="store_true", help="print the memory model for this shape and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.print_model:
        print(model_table(a))
        return 0
    began = time.monotonic()
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"max_batch.py: error: unknown mode(s) {unknown}; known: {', '.join(MODES)}")
    if a.zero and a.dp < 2:
        raise SystemExit(f"max_batch.py: error: --zero 1 shards over the DP replicas: give --dp 2 or more, got {a.dp}")
    info = card_info(a.device)
    cap_gib = memory_cap(a.driver_args)
    capacity = a.capacity_gib or cap_gib or info.get("gpu_memory_gib")
    if a.parallel > 1 and a.device != "cpu":
        gpu = info.get("gpu_memory_gib") or 0.0
        if cap_gib is None:
            raise SystemExit("max_batch.py: error: --parallel > 1 needs --driver-args \"--memory-cap-gib G\" "
                             "(trials side by side must each be confined)")
        if a.parallel * (cap_gib + 1.5) > gpu:
            raise SystemExit(f"max_batch.py: error: --parallel {a.parallel} x (--memory-cap-gib {cap_gib:g} + 1.5 "
                             f"GiB of context) does not fit the GPU's {gpu:g} GiB")
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{datetime.date.today().isoformat()}-{info['gpus']}x{info['card']}-maxbatch.jsonl"
    quantum = a.micro_size or a.micro_batches
    try:
        known = driver_flags(a.driver)
    except RuntimeError as exc:
        raise SystemExit(f"max_batch.py: error: {exc}") from None
    shape = {"dim": a.dim, "depth": a.depth, "pp": a.pp, "dp": a.dp, "zero": a.zero, "schedule": a.schedule,
             "steps": a.steps,
             "micro_batches": None if a.micro_size else a.micro_batches, "micro_size": a.micro_size,
             "driver_args": a.driver_args, "card": info.get("card_full", info["card"]),
             "gpu_memory_gib": info.get("gpu_memory_gib")}
    lock = threading.Lock()

    def log(rec: dict) -> None:
        with lock, path.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    together = a.parallel > 1 and len(modes) > 1
    width = 2 if a.parallel >= 2 * len(modes) else 1
    gate = Gate(a.parallel)
    print(f"max batch: modes {modes}, capacity {capacity} GiB per trial, {a.parallel} trial(s) at once"
          f"{', modes together' if together else ''}, {width} per round; results -> {path}", flush=True)

    def run_mode(mode: str, tmp: str) -> None:
        lacking = missing_flags([str(a.driver), *MODES[mode]], known)
        if lacking:
            why = f"the driver has no {', '.join(lacking)} flag yet: mode {mode} skipped"
            print(f"max batch: {why}", flush=True)
            log({"kind": "result", "mode": mode, "skipped": why, **shape})
            return
        model = mode_model(MODES[mode], a)
        hint = None if a.no_model_hint else model["row_bytes"] / 2**30
        fixed = None if a.no_model_hint else model["fixed_bytes"] / 2**30
        mode_began = time.monotonic()
        print(f"max batch: {mode} ({' '.join(MODES[mode]) or 'no flags'}), {a.time_budget:.0f} s, model "
              f"{model['row_bytes'] / 1e3:.1f} KB/row", flush=True)
        trial = driver_trial(a, MODES[mode], tmp, log, mode, mode_began + a.time_budget, gate)
        found = search_max_batch(trial, quantum=quantum, start=a.start, cap=a.cap, tolerance=a.tolerance,
                                 budget_s=a.time_budget, capacity_gib=capacity, row_gib_hint=hint,
                                 fixed_gib_hint=fixed, width=width, aim=a.aim)
        passed = [t for t in found.trials if t.status == "ok"]
        log({"kind": "result", "mode": mode, "max_batch": found.max_batch, "first_failure": found.first_failure,
             "converged": found.converged, "reason": found.reason, "trials": len(found.trials),
             "peak_gib_at_max": max((t.peak_gib or 0 for t in passed if t.batch == found.max_batch), default=None),
             "fit": found.fit, "predicted_max": found.predicted_max, "capacity_gib": capacity,
             "model_row_bytes": round(model["row_bytes"]), "seconds": round(time.monotonic() - mode_began, 1),
             **shape})
        fit = found.fit
        print(f"max batch: {mode}: {found.max_batch} (first failure {found.first_failure}; {found.reason}; "
              f"{len(found.trials)} trials"
              + (f"; line {fit['a_gib']:.3f} GiB + {fit['b_gib_per_row'] * 2**30 / 1e3:.1f} KB/row, predicted "
                 f"{found.predicted_max}" if fit else "") + ")", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        if together:
            with ThreadPoolExecutor(max_workers=len(modes)) as pool:
                for f in [pool.submit(run_mode, m, tmp) for m in modes]:
                    f.result()
        else:
            for mode in modes:
                run_mode(mode, tmp)
    summary = ratios(newest_results(path, shape))
    log({"kind": "ratios", **summary, **{k: shape[k] for k in SHAPE_KEYS}})
    for name, r in summary.items():
        print(f"max batch ratio {name}: {r['value']} (target {r['target']}, met {r['met']})")
    print(f"results appended to {path} ({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
