"""When capturing the stages' CUDA graphs runs out of memory. A graphed stage runs its first micro-batches eagerly
and captures its graphs at the start of the next step, before that step's first action; the graphs' pools come on
top of what the eager step needs, and the planner's model of them is not yet safe. A run of one process whose
graphs `--cuda-graphs auto` chose then drops them, says so in one line, and runs that step and the rest eagerly:
nothing of the step was computed, so it starts again from the same state. Across processes the error stands (every
rank would first have to learn that one ran out), and so it does under `--cuda-graphs on`, which asks for graphs.
"""
from __future__ import annotations

from typing import Callable

import torch


def capture_ran_out(engine, mode: str, world: int) -> bool:
    """Whether the out-of-memory error engine.train_step just raised came from capturing graphs `auto` chose, on a
    run of one process: the executor was in its step but before its first action, where the captures run."""
    if mode != "auto" or world != 1 or not engine.cuda_graphs.on:
        return False
    activity = engine.activity()
    return bool(activity) and bool(activity.get("in_step")) and activity.get("action") is None


def step_or_run_eagerly(step: Callable[[int], object], at: int, engine, mode: str, world: int,
                        say: Callable[[str], None]):
    """step(at), or, where capturing its graphs ran out of memory (capture_ran_out), the same step again with every
    stage eager. The graphs go after the handler, so its traceback keeps none of their tensors alive."""
    try:
        return step(at)
    except torch.OutOfMemoryError:
        if not capture_ran_out(engine, mode, world):
            raise
    choice = engine.run_eagerly(f"auto: capturing the stages' graphs at step {at} ran out of memory; every stage "
                                "runs eagerly from that step on")
    say(choice.describe())
    return step(at)
