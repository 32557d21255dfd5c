"""The memory model of the max-batch search: bytes per global batch row, per pipeline stage (the derivation
and the table for dim 4096 / depth 16 / pp 2 / 8 micro-batches are in experiments/README.md; `python
experiments/bench/max_batch.py --print-model` prints it for a shape). It gives the search its first slope and
experiments/bench/memory_per_row.py checks it against measured peaks.

With D = dim, e = bytes per element
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
What bounds the ratios under 1F1B at pp=2: only 2 micro-batches
are in flight on stage 0 (1 on the last), so recompute saves at most (2 - 1) * L/m * e * D per row there and
leaves one micro-batch's rebuilt chain (L/m); with the data resident, it alone (e*D per row on each end) caps
the fp16 + recompute ratio at 13.5 D / 2 D = 6.75x. Under GPipe every micro-batch is in flight, which is
where recomputation pays: with streamed data and m = 16 the model gives ~10.7x.
"""
from __future__ import annotations

from typing import Optional


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
