"""When the planner's plan runs out of memory on its first step: every rank agrees, the engine is released, the
next plan the planner predicts to fit (once its predictions are scaled by what the failure showed) is taken and
said in one line, and the run starts again from the same state (the model is rebuilt from the same seed or
checkpoint; step 0's data is drawn from the seed alone).

The agreement is one small all-gather after the first step, which every rank reaches when the failure is its own
compute's (every rank of a symmetric grid, or one stage before it sends): a rank left waiting on a peer that
failed mid-exchange ends at --comm-timeout as any stalled step does (runtime/hang_report.py).
"""
from __future__ import annotations

import gc

import torch

from hybrid_engine.planner.choose import Choice, Prediction, after_out_of_memory
from hybrid_engine.planner.card import GIB
from hybrid_engine.planner.grids import plain


class FirstStepOutOfMemory(Exception):
    """The run's first step ran out of memory on `ranks` (every rank raises it alike)."""

    def __init__(self, ranks: list[int]):
        super().__init__(f"the first step ran out of memory on rank{'s' if len(ranks) > 1 else ''} "
                         f"{', '.join(map(str, ranks))}")
        self.ranks = ranks


def release(engine, device: torch.device) -> None:
    """Free what the engine holds (its executor, buffers and the allocator's cached blocks): the caller drops its
    last reference to the engine first or right after."""
    engine.close()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def take_next(choice: Choice, failed: FirstStepOutOfMemory) -> tuple[Prediction | None, str]:
    """(the plan to run instead, or None; the one line that says so)."""
    c = choice.chosen
    nxt = after_out_of_memory(choice)
    head = (f"planner: {failed} under {c.plan.describe()} (predicted {plain(c.peak / GIB)} GiB of "
            f"{plain(choice.cap / GIB)})")
    if nxt is None:
        return None, (f"{head}, and no other plan that fits is predicted to need less (add ranks, use a higher "
                      "--zero or --recompute full)")
    return nxt, (f"{head}; released it and took {nxt.plan.describe()} (predicted {plain(nxt.peak / GIB)} GiB"
                 + (f", {plain(nxt.step_s * 1e3)} ms/step" if choice.by_time else "")
                 + f"; as flags: {nxt.plan.flags()})")
