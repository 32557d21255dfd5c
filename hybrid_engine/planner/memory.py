"""The peak memory of a plan on each pipeline rank: weights and their companions, the activations the schedule
keeps in flight (the simulator's peak count per rank), a merged weight gradient's stash of every micro-batch, the
data, and one micro-batch's backward.

Calibrated against the measured peaks (torch.cuda.max_memory_allocated) of experiments/results/: config L on one
H200 14.4 GiB (14 bytes a parameter with half weights and SGD: half weights 2, fp32 masters 4, fp32 gradients 4, and
the fp32 weights a stage is built in, 4, which live until the half copy exists); the GPT of the 4-GPU grids 27.9 GiB
on one card. The same rules as experiments/bench/memory_model.py, per layer instead of per MLP row.
"""
from __future__ import annotations

from hybrid_engine.parallel.pipeline.schedule import rank_stages, schedule_placement, stage_rank

from .candidates import Plan
from .model_shape import ModelShape
from .setting import Setting

STATE_BYTES = {"sgd": 0.0, "adam": 8.0, "adamw": 8.0}


def peak_bytes(shape: ModelShape, s: Setting, plan: Plan, peak_in_flight: list[int]) -> list[float]:
    """Predicted peak bytes of each pipeline rank. peak_in_flight: the simulator's most (stage, micro-batch)
    activations held at once per rank (SimResult.peak_activations)."""
    e, mp, m, v = s.elem, s.mp, plan.micro_batches, plan.virtual_stages
    tokens = s.per_dp / m * shape.tokens_per_sample
    cut = shape.cut(s.pp * v)
    placement = schedule_placement(plan.schedule)
    first_rank, last_rank = (stage_rank(st, s.pp, s.pp * v, placement) for st in (0, s.pp * v - 1))
    out = []
    for r in range(s.pp):
        chunks = [cut[st] for st in rank_stages(r, s.pp, s.pp * v, placement)]
        layers = [shape.layers[i] for chunk in chunks for i in chunk]
        params = sum(layer.params for layer in layers) / mp
        state = STATE_BYTES.get(s.optimizer, 8.0)
        if s.half:
            # half weights, fp32 gradients, the fp32 weights built first; fp32 masters and state (sharded by ZeRO-1)
            per_param = 2.0 + 4.0 + 4.0 + (4.0 + state) / (s.dp if s.zero else 1)
        else:
            per_param = 4.0 + 4.0 + state / (s.dp if s.zero else 1)
        weights = params * per_param
        kept = [sum(shape.layers[i].act_split / mp + shape.layers[i].act_whole for i in chunk) * e +
                sum(shape.layers[i].loss_bytes / mp for i in chunk) for chunk in chunks]
        if s.full_recompute:  # only each chunk's input is kept; one micro-batch's chain is rebuilt in the backward
            per_micro = shape.hidden * e
            rebuilt = max(kept) * tokens
        else:
            per_micro = sum(kept) / len(kept)
            rebuilt = 0.0
        activations = peak_in_flight[r] * per_micro * tokens + rebuilt
        stash = (sum(layer.stash / mp for layer in layers) * e * tokens * m) if plan.merge_wgrad else 0.0
        first, last = r == first_rank, r == last_rank
        data = s.per_dp * shape.data_bytes / 2 * (first + last)
        backward = 3 * max(layer.act_split / mp + layer.act_whole for layer in layers) * e * tokens
        out.append(weights + activations + stash + data + backward)
    return out
