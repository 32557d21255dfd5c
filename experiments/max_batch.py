#!/usr/bin/env python3
"""Max batch finder (issue #6, item 4): the largest global batch the engine trains without running out of memory.

    python experiments/max_batch.py --modes fp32,fp16,fp16-recompute [--dim 8192 --depth 16 --micro-batches 8]

For each mode (a row of MODES: driver flags), at --pp 2 (one pipeline over 2 GPUs, 1F1B by default), a search
over the global batch, in multiples of the micro-batch count. Every trial is a fresh `torchrun hybrid_engine.py
... --steps 2 --warmup 0`: it passes if it exits 0 and wrote its step records, it is out of memory if it failed
and stderr says so ("out of memory", OutOfMemoryError, CUBLAS_STATUS_ALLOC_FAILED); any other failure stops
that mode with the error. A trial that runs past --trial-timeout counts as too big too (reported as such).

The search: double from --start until a failure (once two passing trials have reported their peak memory and
the GPU's size is known, jump to where the straight line through them meets the GPU's memory: peak memory
grows linearly with the batch), then bisect until the bracket is within --tolerance. --cap bounds the batch,
--time-budget the wall time of the whole command: a trial still running then is stopped, and the answer is the
bracket so far ("converged": false).

The batch is the global batch of the driver: with fixed --micro-batches a bigger batch means bigger
micro-batches; --micro-size R instead keeps R rows per micro-batch and raises the micro-batch count with the
batch (1F1B then holds at most pp micro-batches of activations, whatever the batch).

Writes JSON lines to <out>/<date>-<gpus>x<card>-maxbatch.jsonl (appending, so modes run in separate commands
accumulate): {"kind": "trial", ...} per trial, {"kind": "result", ...} per mode, and {"kind": "ratios", ...}
over the newest result of every mode in the file, against the targets fp16 >= 2x fp32 and
fp16 + recomputation >= 8x fp32.
"""
from __future__ import annotations

import argparse
import shlex
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from launch import (DRIVER, REPO, child_env, driver_flags, error_line, execute, free_port, is_oom,  # noqa: E402
                    missing_flags, shown, torchrun)

MODES = {  # name -> driver flags; a flag the driver lacks skips the mode with a message
    "fp32": (),
    "fp16": ("--amp", "fp16"),
    "fp16-recompute": ("--amp", "fp16", "--recompute"),
    "bf16": ("--amp", "bf16"),
    "fp16-autocast": ("--amp", "fp16", "--amp-impl", "autocast"),
}
TARGETS = {"fp16": 2.0, "fp16-recompute": 8.0}  # x the fp32 max batch


@dataclass
class Trial:
    batch: int
    status: str  # ok | oom | timeout (too slow: counts as too big) | budget (cut by --time-budget) | error
    peak_gib: Optional[float] = None  # the largest per-rank peak (torch.cuda.max_memory_allocated)
    seconds: float = 0.0
    message: str = ""


@dataclass
class Search:
    max_batch: Optional[int]  # the largest batch that passed
    first_failure: Optional[int]  # the smallest batch that failed
    converged: bool
    reason: str
    trials: list[Trial] = field(default_factory=list)


def round_down(x: float, quantum: int) -> int:
    return max(quantum, int(x) // quantum * quantum)


def predict(trials: list[Trial], capacity_gib: Optional[float]) -> Optional[float]:
    """The batch at which the line through the two largest passing trials' peaks reaches capacity_gib."""
    points = sorted({t.batch: t.peak_gib for t in trials if t.status == "ok" and t.peak_gib}.items())
    if capacity_gib is None or len(points) < 2:
        return None
    (b1, p1), (b2, p2) = points[-2], points[-1]
    slope = (p2 - p1) / (b2 - b1)
    if slope <= 0:
        return None
    return b2 + (capacity_gib - p2) / slope


def next_batch(lo: Optional[int], hi: Optional[int], trials: list[Trial], quantum: int, cap: int,
               capacity_gib: Optional[float], tolerance: float = 0.05) -> int:
    pred = predict(trials, capacity_gib)
    if hi is None:  # still growing: double, or jump to where the memory line meets the GPU's size
        guess = 2 * lo
        if pred is not None:
            guess = min(pred, 64 * lo) if pred > 1.1 * lo else 1.25 * lo
        return max(lo + quantum, min(round_down(guess, quantum), cap))
    if lo is None:  # even the first trial failed: halve
        return round_down(hi // 2, quantum)
    mid = max(lo + quantum, round_down((lo + hi) // 2, quantum))
    fails_in_a_row = next(i for i, t in enumerate(reversed([Trial(0, "ok")] + trials)) if t.status == "ok")
    if pred is not None and fails_in_a_row <= 2:
        # the line overshot a little (CUDA context, fragmentation): step down from the failure, not to the middle
        below = round_down(hi * (1 - 2 * tolerance), quantum)
        if lo < below < hi:
            return max(mid, below)
    return mid


def search_max_batch(trial: Callable[[int], Trial], *, quantum: int, start: int, cap: int, tolerance: float = 0.05,
                     budget_s: float = math.inf, capacity_gib: Optional[float] = None,
                     clock: Callable[[], float] = time.monotonic) -> Search:
    """Largest multiple of `quantum` in [quantum, cap] for which trial(batch).status == "ok" (memory grows with
    the batch, so pass/fail is monotonic). Stops when the bracket is within max(quantum, tolerance * best),
    at the cap, on an error trial, or when the next trial would likely end past `budget_s`."""
    cap = round_down(cap, quantum)
    began = clock()
    lo: Optional[int] = None
    hi: Optional[int] = None
    trials: list[Trial] = []
    batch = min(round_down(start, quantum), cap)
    while True:
        result = trial(batch)
        trials.append(result)
        if result.status == "error":
            return Search(lo, hi, False, f"trial at batch {batch} failed: {result.message}", trials)
        if result.status == "budget":
            return Search(lo, hi, False, "time budget spent", trials)
        if result.status == "ok":
            lo = batch
        else:
            hi = batch
        if lo is not None and hi is not None and hi - lo <= max(quantum, tolerance * lo):
            return Search(lo, hi, True, f"bracket within {tolerance:.0%}", trials)
        if hi is None and lo >= cap:
            return Search(lo, hi, True, f"reached the cap ({cap}): the true limit is higher", trials)
        if lo is None and hi <= quantum:
            return Search(lo, hi, True, f"even batch {quantum} fails", trials)
        if clock() - began + result.seconds > budget_s:
            return Search(lo, hi, False, "time budget spent", trials)
        batch = next_batch(lo, hi, trials, quantum, cap, capacity_gib, tolerance)


def driver_trial(a: argparse.Namespace, flags: tuple[str, ...], tmp: str, log: Callable[[dict], None],
                 mode: str) -> Callable[[int], Trial]:
    """trial(batch): one fresh torchrun of the driver at that global batch."""
    def trial(batch: int) -> Trial:
        metrics = os.path.join(tmp, f"trial{batch}.jsonl")
        micro = batch // a.micro_size if a.micro_size else a.micro_batches
        cmd = torchrun(a.pp, free_port()) + [
            str(a.driver), "--pp", str(a.pp), "--schedule", a.schedule, "--dim", str(a.dim), "--depth", str(a.depth),
            "--batch-size", str(batch), "--micro-batches", str(micro), "--steps", str(a.steps), "--warmup", "0",
            "--comm-timeout", "60", "--quiet", "--metrics", metrics, *flags, *shlex.split(a.driver_args),
            *(["--device", "cpu"] if a.device == "cpu" else [])]
        left = a.deadline - time.monotonic()  # never run past the whole command's budget
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
            result.status = "oom" if is_oom(err) else "error"
            result.message = error_line(err, rc)
        log({"kind": "trial", "mode": mode, **asdict(result), "micro_batches": micro, "cmd": shown(cmd)})
        print(f"  {mode} batch {batch:>8}: {result.status:7} {result.seconds:6.1f} s"
              + (f"  peak {result.peak_gib:.2f} GiB" if result.peak_gib else "")
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


SHAPE_KEYS = ("dim", "depth", "pp", "schedule", "micro_batches", "micro_size", "driver_args")


def newest_results(path: Path, shape: dict) -> dict[str, dict]:
    """The newest result of every mode in the file that was searched at the same model and grid shape."""
    results: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if (rec.get("kind") == "result" and rec.get("max_batch")
                    and all(rec.get(k) == shape.get(k) for k in SHAPE_KEYS)):
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


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--modes", default="fp32,fp16,fp16-recompute", help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--micro-batches", type=int, default=8, help="fixed micro-batch count (the batch quantum)")
    p.add_argument("--micro-size", type=int, default=None,
                   help="instead: fixed rows per micro-batch, micro-batches = batch / rows")
    p.add_argument("--start", type=int, default=1024, help="first batch tried")
    p.add_argument("--cap", type=int, default=2**20, help="largest batch tried")
    p.add_argument("--tolerance", type=float, default=0.05, help="stop when (fail - pass) <= this x pass")
    p.add_argument("--steps", type=int, default=2, help="steps per trial")
    p.add_argument("--trial-timeout", type=float, default=240.0, help="seconds one trial may take")
    p.add_argument("--time-budget", type=float, default=540.0, help="seconds for the whole command")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto", help="cpu: gloo ranks (tests)")
    p.add_argument("--driver", type=Path, default=DRIVER, help=argparse.SUPPRESS)  # tests substitute a fake
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--driver-args", default="",
                   help="more driver flags for every trial, e.g. \"--memory-cap-gib 8\" (a smaller card: quicker trials)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    began = time.monotonic()
    a.deadline = began + a.time_budget
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"max_batch.py: error: unknown mode(s) {unknown}; known: {', '.join(MODES)}")
    info = card_info(a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{datetime.date.today().isoformat()}-{info['gpus']}x{info['card']}-maxbatch.jsonl"
    quantum = a.micro_size or a.micro_batches
    try:
        known = driver_flags(a.driver)
    except RuntimeError as exc:
        raise SystemExit(f"max_batch.py: error: {exc}") from None
    shape = {"dim": a.dim, "depth": a.depth, "pp": a.pp, "schedule": a.schedule, "steps": a.steps,
             "micro_batches": None if a.micro_size else a.micro_batches, "micro_size": a.micro_size,
             "driver_args": a.driver_args, "card": info.get("card_full", info["card"]), "gpu_memory_gib": info.get("gpu_memory_gib")}

    def log(rec: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    print(f"max batch: modes {modes}, results -> {path}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            lacking = missing_flags([str(a.driver), *MODES[mode]], known)
            if lacking:
                why = f"the driver has no {', '.join(lacking)} flag yet: mode {mode} skipped"
                print(f"max batch: {why}", flush=True)
                log({"kind": "result", "mode": mode, "skipped": why, **shape})
                continue
            left = a.time_budget - (time.monotonic() - began)
            if left <= 0:
                log({"kind": "result", "mode": mode, "skipped": "time budget spent", **shape})
                continue
            print(f"max batch: {mode} ({' '.join(MODES[mode]) or 'no flags'}), {left:.0f} s left", flush=True)
            found = search_max_batch(driver_trial(a, MODES[mode], tmp, log, mode), quantum=quantum, start=a.start,
                                     cap=a.cap, tolerance=a.tolerance, budget_s=left,
                                     capacity_gib=info.get("gpu_memory_gib"))
            passed = [t for t in found.trials if t.status == "ok"]
            log({"kind": "result", "mode": mode, "max_batch": found.max_batch, "first_failure": found.first_failure,
                 "converged": found.converged, "reason": found.reason, "trials": len(found.trials),
                 "peak_gib_at_max": max((t.peak_gib or 0 for t in passed if t.batch == found.max_batch), default=None),
                 **shape})
            print(f"max batch: {mode}: {found.max_batch} (first failure {found.first_failure}; {found.reason})",
                  flush=True)
    summary = ratios(newest_results(path, shape))
    log({"kind": "ratios", **summary, **{k: shape[k] for k in SHAPE_KEYS}})
    for name, r in summary.items():
        print(f"max batch ratio {name}: {r['value']} (target {r['target']}, met {r['met']})")
    print(f"results appended to {path} ({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
