#!/usr/bin/env python3
"""Max batch finder (issue #6, item 4): the largest global batch the engine trains without running out of memory.

    python experiments/bench/max_batch.py --modes fp32,fp16,fp16-recompute [--dim 8192 --depth 16 --micro-batches 8]
    python experiments/bench/max_batch.py --print-model --dim 4096     # the memory model, no GPU needed
    python experiments/bench/max_batch.py --modes fp16 --dp 2 --zero 1  # the distributed optimizer, 2 pipelines

For each mode (a row of MODES: driver flags), at --pp 2 (one pipeline over 2 GPUs, 1F1B by default; --dp N runs
N pipelines, pp x N GPUs, and --zero 1 shards their fp32 masters and optimizer state over them), a search over
the global batch, in multiples of the micro-batch count. Every trial is a fresh `torchrun hybrid_engine.py
... --steps 2 --warmup 0`: it passes if it exits 0 and wrote its step records, it is out of memory if it failed
and stderr says so ("out of memory", OutOfMemoryError, CUBLAS_STATUS_ALLOC_FAILED). A trial that runs past
--trial-timeout counts as too big too. A trial the launcher failed (EADDRINUSE / "address already in use",
a rendezvous error, a GPU busy in exclusive mode: launch.is_transient) runs once more on a new port; any other
failure stops that mode with the error.

The search (a few trials, each ~20 s, mostly process start-up) is max_batch_search.py; its first slope comes
from the memory model, memory_model.py (`--print-model` prints it for a shape).

--parallel N runs up to N trials at once on the same GPUs: all modes together, and with N >= 2 x modes two
batches per round per mode (the planned one and the one the planner would pick next if the first went as the
line predicts). Sound only because every trial confines itself with --memory-cap-gib (a per-process allocator
limit; peaks are per process): N x (cap + 1.5 GiB) must fit the GPU. If the GPU refuses a second process
(exclusive compute mode), the search falls back to one trial at a time.

The batch is the global batch of the driver: with fixed --micro-batches a bigger batch means bigger
micro-batches; --micro-size R instead keeps R rows per micro-batch and raises the micro-batch count with the
batch (1F1B then holds at most pp micro-batches of activations, whatever the batch).

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
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

from launch import (DRIVER, GPU_BUSY, REPO, child_env, driver_flags, error_line, execute, free_port,  # noqa: E402
                    is_oom, is_transient, missing_flags, shown, torchrun)
from max_batch_search import Trial, search_max_batch  # noqa: E402
from memory_model import memory_model  # noqa: E402

from hybrid_engine.metrics import records  # noqa: E402

MODES = {  # name -> driver flags; a flag the driver lacks skips the mode with a message
    "fp32": (),
    "fp16": ("--amp", "fp16"),
    "fp16-recompute": ("--amp", "fp16", "--recompute"),
    "bf16": ("--amp", "bf16"),
    "fp16-autocast": ("--amp", "fp16", "--amp-impl", "autocast"),
}
TARGETS = {"fp16": 2.0, "fp16-recompute": 8.0}  # x the fp32 max batch


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
            steps = records.steps(records.read(metrics)) if Path(metrics).exists() else []
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
