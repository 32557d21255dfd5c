"""The benches' one GPU timer: a callable's median over CUDA events, each call timed alone (the device drained
before the next starts, so no call's time hides in another's queue)."""
from __future__ import annotations

import statistics

import torch


def median_ms(fn, repeat: int, warmup: int = 1) -> float:
    """fn()'s median milliseconds over `repeat` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
