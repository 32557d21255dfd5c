"""Run the driver (hybrid_engine.py, any flags) under torch.profiler and write, per rank, what each operator and
kernel cost over the whole run: a JSON of {name: [calls, self device µs, self CPU µs]} plus the run's wall time
and the GPU-busy time (the union of kernel intervals). Two trees' files side by side (compare_profiles.py) show
where one spends more: an operator called more often, a kernel that got slower, or GPU idle between kernels.

    PROFILE_OUT=/tmp/new torchrun --nproc_per_node=2 experiments/bench/profile_driver.py --model gpt --mp 2 ...

Run from the tree to profile (it runs ./hybrid_engine.py). The driver leaves through os._exit (no interpreter
teardown); here that exit becomes an exception so the profile can be written.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile


class _Left(BaseException):
    """The driver's os._exit, caught."""


def _leave(code: int) -> None:
    raise _Left(code)


def busy_us(events) -> float:
    """The union of the device kernels' intervals, µs."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type.name == "CUDA")
    total, start, end = 0.0, None, None
    for s, e in spans:
        if end is None or s > end:
            total += 0 if end is None else end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (0 if end is None else end - start)


def main() -> None:
    out, rank = os.environ["PROFILE_OUT"], os.environ.get("RANK", "0")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sys.argv = ["hybrid_engine.py"] + sys.argv[1:]
    sys.path.insert(0, os.getcwd())  # the tree run from, not this script's folder
    os._exit = _leave
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        try:
            runpy.run_path("hybrid_engine.py", run_name="__main__")
        except (SystemExit, _Left):
            pass
    wall = time.perf_counter() - start
    ops = {e.key: [e.count, e.self_device_time_total, e.self_cpu_time_total] for e in prof.key_averages()}
    with open(f"{out}-rank{rank}.json", "w") as f:
        json.dump({"wall_s": wall, "gpu_busy_us": busy_us(prof.events()), "ops": ops}, f)


if __name__ == "__main__":
    main()
