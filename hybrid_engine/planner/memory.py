"""The peak memory of a plan on each pipeline rank: weights and their companions at the run's ZeRO level, the
activations its schedule keeps in flight (each rank's program walked, stage by stage), the loss's fp32 logits, a merged
weight gradient's stash of every micro-batch, the data, and one backward's temporaries; and whether a peak fits a
cap once the caching allocator's overhead and a margin are added (`fits`).

Per parameter, with half weights (bf16/fp16) and an optimizer keeping S bytes of state (AdamW 8, SGD 0): half
weights 2, fp32 gradients 4, fp32 masters 4 and S (a stage is built layer by layer in its weights' dtype: no fp32
copy of it outlives its construction). ZeRO shards over the shard group (--zero-shard-size, else every DP rank) and
replicates across: 1 the masters and state, 2 the gradients too (plus the buckets being reduce-scattered, whole),
3 the weights as well, plus the gathered working set: the layers being computed and prefetched, or under pipeline
parallelism the stage's whole half weights, kept gathered from its first forward to its last backward.

Calibrated against peaks measured by torch.cuda.max_memory_allocated: config L on one H200 10.4 GiB (10 bytes a
parameter with SGD); the Llama-1B shape on one H200 20.1 GiB at 8 micro-batches and 25.8 at 4 (18 bytes a parameter
with AdamW, 1.5 MB of activations a token); the Llama-8B shape on 4 x H200 at dp4: zero 1 89.9 GiB, zero 2 69.6,
zero 3 59.5 (tests/planner/test_memory_model.py pins each, and the points derived from earlier runs). Stages run
as CUDA graphs hold their graphs' pools instead of the activations in flight: per micro-batch index for native
chains, per slot for autograd stages (graph_pools.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.parallel.pipeline.schedule import compute_schedule, rank_stages, schedule_placement, stage_rank

from .candidates import Plan
from .card import GIB
from .graph_pools import GraphedStage, graphed_bytes
from .model_shape import ModelShape
from .setting import Setting

STATE_BYTES = {"sgd": 0.0, "adam": 8.0, "adamw": 8.0}
CAP_MARGIN = 0.03  # a plan within 3% of the cap is not taken
# What torch.cuda.max_memory_allocated does not see: the caching allocator reserves more than it hands out, and
# more of what is allocated and freed every step (activations, gathered weights: blocks split, rounded and kept for
# their stream) than of what lives through the run; the CUDA context and NCCL's buffers lie outside it. Measured
# (torch.cuda.max_memory_reserved less max_memory_allocated) on the 8B under a 78 GiB cap on 4 x H200: 10-16% of
# the predicted per-step share on each rank of dp2 x pp2 interleaved (v4, 8 micro-batches), 12% at dp4 zero 2 with
# 4 micro-batches; the largest is taken (tests/planner/test_memory_model.py).
DYNAMIC_OVERHEAD = 0.16
RESERVED_OUTSIDE_BYTES = 1.0 * GIB
GATHER_PREFETCH = 1  # ZeRO-3: layers gathered ahead of the one computing
REDUCING_BUCKETS = 3  # ZeRO-2/3: the bucket filling and the two reductions csrc/executor/dp_grad_sync.h lets run
BACKWARD_TEMPORARIES = 1.0  # a layer's backward holds gradients of about what it keeps


@dataclass(frozen=True)
class RankPeak:
    """A rank's predicted peak: what lives through the run (weights and their companions) and what a step
    allocates and frees (activations, the gathered working set, temporaries, data)."""

    static: float
    dynamic: float

    @property
    def total(self) -> float:
        return self.static + self.dynamic

    @property
    def needed(self) -> float:
        """What the rank needs of the device: the allocator's overhead and what lives outside it added."""
        return self.total + DYNAMIC_OVERHEAD * self.dynamic + RESERVED_OUTSIDE_BYTES


def usable_bytes(cap: float) -> float:
    """The most a plan may need under a cap: a plan within CAP_MARGIN of it is not taken."""
    return cap * (1 - CAP_MARGIN)


def fits(peaks: list[RankPeak], cap: float) -> bool:
    """Whether a plan whose ranks peak at `peaks` is taken under `cap` (the one rule: the choice, the grid table
    and the fallback after an out-of-memory ask it)."""
    return max(p.needed for p in peaks) <= usable_bytes(cap)


def weight_bytes(params: float, layer_params: list[float], s: Setting) -> tuple[float, float]:
    """(weights, gradients, masters and optimizer state; the working set gathered or bucketed during a step) of a
    rank holding `params` (its MP share) in layers of `layer_params`."""
    largest_layer = max(layer_params)
    shard = s.shard_size
    state = STATE_BYTES.get(s.optimizer, 8.0)
    weights, masters = (2.0, 4.0) if s.half else (4.0, 0.0)
    by_zero = {
        "weights": weights / shard if s.zero >= 3 else weights,
        "grads": 4.0 / shard if s.zero >= 2 else 4.0,
        "masters+state": (masters + state) / shard if s.zero >= 1 else masters + state,
    }
    working = 0.0
    if s.zero >= 2:  # buckets whole until reduce-scattered: one filling, and at most two reductions in flight
        working += min(params * 4.0, reducing_bytes(layer_params, s.bucket_bytes))
    if s.zero >= 3:
        if s.pp > 1:  # the stage's weights stay gathered through the step's micro-batches
            working += params * weights
        else:
            working += min(params, (1 + GATHER_PREFETCH) * largest_layer) * weights
    return params * sum(by_zero.values()), working


def reducing_bytes(layer_params: list[float], bucket_bytes: float) -> float:
    """The fp32 gradient buckets whole at once under ZeRO-2/3 (layer_params in layer order): REDUCING_BUCKETS
    consecutive ones, the largest such run; a bucket holds consecutive layers up to `bucket_bytes` and a layer
    larger than that alone (data_parallel/grad_buffer.py), so a large LM head or block is a bucket of its size."""
    sizes = [max(bucket_bytes, 4.0 * p) for p in layer_params]
    sizes += [bucket_bytes] * (REDUCING_BUCKETS - len(sizes))
    return max(sum(sizes[i:i + REDUCING_BUCKETS]) for i in range(len(sizes) - REDUCING_BUCKETS + 1))


def live_peaks(program: list, per_stage: list[float], free_at_input_grad: bool) -> float:
    """The most activation bytes a rank's compute program (its F, B, I, W in order) holds at once: a stage's
    micro-batch is held from its F to its last backward action (its W, which autograd's saved tensors wait for;
    its I under merged W, whose stash is counted apart)."""
    last = {}
    for n, a in enumerate(program):
        kind = a.type.name
        if kind != "F" and not (kind == "W" and free_at_input_grad):
            last[(a.stage, a.micro)] = n
    live = peak = 0.0
    for n, a in enumerate(program):
        key = (a.stage, a.micro)
        if a.type.name == "F":
            live += per_stage[a.stage]
            peak = max(peak, live)
        elif last.get(key) == n:
            live -= per_stage[a.stage]
    return peak


def temporaries(layers: list, mp: int, elem: float, tokens: float) -> float:
    """One backward's temporaries beside what `layers` keep: BACKWARD_TEMPORARIES of the largest layer's."""
    return BACKWARD_TEMPORARIES * max(layer.act_split / mp + layer.act_whole for layer in layers) * elem * tokens


def peak_bytes(shape: ModelShape, s: Setting, plan: Plan, workspace: float = 0.0,
               replayed: bool = False) -> list[RankPeak]:
    """Predicted peak of each pipeline rank (workspace: what the card's libraries allocate on every rank;
    replayed: the stages run as CUDA graphs, step_time.graphed)."""
    e, mp, m, v = s.elem, s.mp, plan.micro_batches, plan.virtual_stages
    tokens = s.per_dp / m * shape.tokens_per_sample  # a cp rank's share of each sequence (context.py)
    placement = schedule_placement(plan.schedule)
    cut = shape.cut(s.pp * v, s.pp, placement)
    first_rank, last_rank = (stage_rank(st, s.pp, s.pp * v, placement) for st in (0, s.pp * v - 1))
    # a stage's activations per micro-batch: what its layers keep, and the loss's logits and their fp32 copies
    kept = [(sum(shape.layer(i).act_split / mp + shape.layer(i).act_whole for i in chunk) * e +
             sum(shape.layer(i).loss_bytes / mp for i in chunk)) * tokens +
            sum(shape.layer(i).loss_fixed / mp for i in chunk) for chunk in cut]
    if s.full_recompute:  # only each stage's input is kept; one micro-batch's chain is rebuilt in the backward
        held = [shape.hidden * e * tokens] * len(cut)
    else:
        held = kept
    programs = compute_schedule(plan.schedule, s.pp, m, v, plan.lookahead)
    out = []
    for r in range(s.pp):
        stages = rank_stages(r, s.pp, s.pp * v, placement)
        layers = [shape.layer(i) for st in stages for i in cut[st]]
        params = sum(layer.params for layer in layers) / mp
        weights, working = weight_bytes(params, [layer.params / mp for layer in layers], s)
        weights += sum(layer.fp8_cache for layer in layers) / mp  # fp8's weight cache, through the step
        activations = live_peaks(programs[r], held, plan.merge_wgrad)
        if s.full_recompute:
            activations += max(kept[st] for st in stages)
        stash = (sum(layer.stash / mp for layer in layers) * e * tokens * m) if plan.merge_wgrad else 0.0
        first, last = r == first_rank, r == last_rank
        data = s.per_dp * shape.data_bytes / 2 * (first + last)
        backward = temporaries(layers, mp, e, tokens)
        if replayed and shape.native:  # every micro-batch index keeps its activations and its backward's temporaries
            activations = m * sum(held[st] for st in stages)
            backward *= m * len(stages)
        elif replayed:  # autograd stages: their graphs' pools, static buffers and transfers (graph_pools.py)
            n = s.pp * v
            by_stage = {st: [shape.layer(i) for i in cut[st]] for st in stages}
            remote = [stage_rank(st, s.pp, n, placement) != r for st in range(n)]
            graphed = {st: GraphedStage(held[st], temporaries(by_stage[st], mp, e, tokens),
                                        sum(layer.params / mp * e for layer in by_stage[st] if not layer.matmul_params),
                                        st == 0, st == n - 1, st > 0 and remote[st - 1], st < n - 1 and remote[st + 1])
                       for st in stages}
            boundary = shape.hidden * e * tokens / (mp if s.sequence_parallel else 1)
            activations, backward = graphed_bytes(programs[r], graphed, boundary, m, workspace), 0.0
        out.append(RankPeak(weights + workspace, working + activations + stash + data + backward))
    return out
