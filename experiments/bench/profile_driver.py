"""Run the driver (hybrid_engine.py, any flags) under torch.profiler and write, per rank, what each operator and
kernel cost over the whole run: a JSON of {name: [calls, self device µs, self CPU µs]} plus the run's wall time
and the GPU-busy time (the union of kernel intervals). Two trees' files side by side (compare_profiles.py) show
where one spends more: an operator called more often, a kernel that got slower, or GPU idle between kernels.

    PROFILE_OUT=/tmp/new torchrun --nproc_per_node=2 experiments/bench/profile_driver.py --model gpt --mp 2 ...

PROFILE_STEPS=S:A records only training steps S+1 .. S+A (the steady state, without the first steps' compiling and
communicator set-up), and the file then says how many steps it holds ("steps"), so per-step figures divide by it.

Run from the tree to profile (it runs ./hybrid_engine.py in this process: driver_in_process.py).
"""
from __future__ import annotations

import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import driver_in_process  # this folder: the script's own


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


def step_window(spec: str) -> tuple[int, int] | None:
    """PROFILE_STEPS "S:A" as (steps skipped, steps recorded); None records the whole run."""
    if not spec:
        return None
    skip, active = (int(v) for v in spec.split(":"))
    if skip < 1 or active < 1:
        raise SystemExit(f"PROFILE_STEPS={spec}: give S:A with S >= 1 steps skipped and A >= 1 recorded")
    return skip, active


def write(path: str, prof, wall_s: float, steps: int | None) -> None:
    ops = {e.key: [e.count, e.self_device_time_total, e.self_cpu_time_total] for e in prof.key_averages()}
    with open(path, "w") as f:
        json.dump({"wall_s": wall_s, "gpu_busy_us": busy_us(prof.events()), "steps": steps, "ops": ops}, f)


def main() -> None:
    out, rank = os.environ["PROFILE_OUT"], os.environ.get("RANK", "0")
    path = f"{out}-rank{rank}.json"
    window = step_window(os.environ.get("PROFILE_STEPS", ""))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    driver_in_process.enter()
    kwargs, began = {}, [time.perf_counter()]
    if window:
        skip, active = window

        def ready(prof) -> None:  # the window's wall time: from the end of step S to the end of step S + A
            write(path, prof, time.perf_counter() - began[0], active)

        kwargs = {"schedule": schedule(wait=skip - 1, warmup=1, active=active, repeat=1), "on_trace_ready": ready}
    with profile(activities=activities, **kwargs) as prof:
        if window:
            from hybrid_engine.engine.engine import Engine
            train_step = Engine.train_step

            def stepped(self, *args, **kw):
                result = train_step(self, *args, **kw)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                prof.step()
                if prof.step_num == skip:
                    began[0] = time.perf_counter()
                return result

            Engine.train_step = stepped
        driver_in_process.run()
    if not window:
        write(path, prof, time.perf_counter() - began[0], None)


if __name__ == "__main__":
    main()
