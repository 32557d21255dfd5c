"""The time of one step of a plan: every stage's F, B, I and W from the card's rates, the pipeline from the C++
simulator (csrc/schedule/simulate.h), and what runs around it (the DP gradient collectives that the backward does
not hide, the update).

Calibrated against experiments/results/2026-11-27-4xH200-grids-mlp.json (config L on one H200: 1f1b with one
micro-batch 14.2 ms, zb1 + merged W with 4 and 8 micro-batches 15.3 and 19.4 ms): a weight gradient accumulated per
micro-batch costs 12 bytes a parameter of memory traffic (ACCUMULATE_BYTES; 4 for the first micro-batch), which is
why merging the weight gradients into one GEMM pays for the MLP's large layers. Checked against every measured step
whose plan is known, tests/planner/test_step_predictions.py. A --fp8 run's block GEMMs run at the card's fp8 rate,
beside their quantization and their weight gradients' addition into the main grads (fp8_time.py). An eager
decoder block's action lasts at least as long as its host takes to issue its aten operators (host_floor), which
sets the pace of the Llama's unfused blocks under tensor parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.parallel.pipeline.schedule import (Costs, SimResult, make_schedule, rank_stages, schedule_placement,
                                                      simulate, stage_rank)

from .candidates import Plan
from hybrid_engine.config.engine import ScheduleConfig
from hybrid_engine.parallel.pipeline.graphs import GraphFacts, splits_backward, why_not

from .card import ATTENTION_BACKWARD, Card
from .context_comm import CommChoice, KvTraffic, choose_comm
from .fp8_time import fp8_work, gemm_pass_s, reduction_s
from .model_shape import ModelShape
from .setting import Setting

UPDATE_BYTES = {"sgd": 14.0, "adam": 30.0, "adamw": 30.0}  # per parameter: masters, gradient, state, half weights
UPDATE_BYTES_FP32 = {"sgd": 12.0, "adam": 28.0, "adamw": 28.0}
DP_BUCKET_BYTES = 256 * 2**20
# Autograd stages (the decoders): slower GEMMs and elementwise work than the native chain, a fixed cost per layer
# and action, and a weight gradient accumulated inside its GEMM, so merging the W actions saves no time (and keeps
# every micro-batch's inputs). The slowdown fitted to the GPT of experiments/results/2026-11-27-4xH200-grids-gpt.json
# (one GPU 424 ms, pp4 167 ms, interleaved 150 ms); the cost per action to the GPT-1B on one H200 at 1, 4 and 8
# micro-batches (2026-11-27-1xH200-plan-one.json: 362 / 372 / 390 ms, ~65 us a layer action more per micro-batch)
# and at pp4 (2026-11-27-4xH200-plan-four.json), whose steps a larger cost overpredicts (250 us: +19% at 8).
# Their MP all-reduces run at 1 / 1.5 of the bus rate, plus the card's synchronisation (Card.mp_sync_s): the GPT at
# tp4 with 8 and 2 micro-batches (grids-gpt 306 and 159 ms, engine A/B 290 and 231 ms at 8) and at tp2 (284 ms);
# the Llama's 32k-token cp2 x tp2 step above its cp4 step (2026-11-27-4xH200-long-seq.json, 362 against 354 ms):
# at the bus rate itself the plan command ranks cp2 x tp2 over cp4 at 128k tokens, against that measurement.
AUTOGRAD_SLOWDOWN = 1.25
AUTOGRAD_ACTION_S = 120e-6
AUTOGRAD_MP_SLOWDOWN = 1.5
# A native weight gradient accumulated per micro-batch after the first: the GEMM writes it in half and the sum reads
# it back and reads and writes the fp32 gradient (2 + 2 + 8 bytes a parameter). Checked against config L and C on
# one H200 under 1f1b with 4 and 8 micro-batches (experiments/results/2026-11-27-1xH200-plan-one.json: L 27.0 / 44.9
# ms, C 12.4 / 22.2 ms; predicted 28.3 / 44.8 and 11.3 / 20.6, where 8 bytes predicts 25.2 / 37.6 and 9.8 / 17.0).
ACCUMULATE_BYTES = 12.0
# Context parallelism's attention runs block by block (parallel/context/ring.py: cp blocks; all_gather.py: each of
# the rank's two chunks against the keys before it and against itself), and each block moves memory beside its
# kernel, per query element: forward, the block's output merged into the fp32 output by log-sum-exp (its fp32 copy
# written and read, the running output read and written twice: 26); backward, dQ accumulated in fp32 (its fp32
# copy and the running sum: 18), the gradient made contiguous (4). Flash takes K/V expanded to the query heads
# (written, read again: 8 forward, 8 backward) and gives dK/dV expanded, folded onto the kv heads (8); cuDNN takes
# the kv heads as they are, and a half block's rows as contiguous copies (about 2 a query element, backward).
BLOCK_BYTES = {"flash": (34.0, 38.0), "cudnn": (26.0, 24.0)}  # (forward, backward); a CPU kernel's as flash's


@dataclass(frozen=True)
class StepTime:
    """A plan's predicted step, and where its time goes."""

    step_s: float
    pipeline_s: float
    bubble: float
    dp_exposed_s: float
    mp_allreduces: int
    mp_exposed_s: float
    update_s: float
    sim: SimResult
    cp_comm: CommChoice | None = None
    """Context parallelism's K/V transfers (None without cp): the variant, both variants' costs, why."""
    cp_exposed_s: float = 0.0
    """What those transfers expose per step on the slowest rank."""
    graphs: bool = False
    """The stages replay as CUDA graphs (--cuda-graphs auto: where that is predicted faster)."""


def schedule_of(plan: Plan) -> ScheduleConfig:
    """The run's schedule configuration that a plan names."""
    return ScheduleConfig(plan.schedule, plan.micro_batches, plan.virtual_stages, plan.lookahead, plan.merge_wgrad)


def graphed(shape: ModelShape, card: Card, s: Setting, plan: Plan) -> bool:
    """Whether the plan's stages may replay as CUDA graphs: what the run asks of the same facts
    (parallel/pipeline/graphs.py's why_not; --cuda-graphs not off).
    Each F, B and I then costs one launch, card.action_overhead_s, instead of the host's work for every layer (an
    autograd stage's Python and launches, AUTOGRAD_ACTION_S a layer, included), and the DP gradient collectives
    start after the last backward's replay instead of under it (under a zero-bubble schedule, under its last W,
    which stays eager). The kernels' own time is the eager stage's."""
    if s.cuda_graphs == "off":
        return False
    native = (shape.native,) * (s.pp * plan.virtual_stages)
    facts = GraphFacts(card.gpu, native, schedule_of(plan), s.pp, s.full_recompute, s.selective_recompute, s.zero,
                       s.cp, shape.builtin_loss, s.trace)
    return not why_not(facts)


def stage_costs(shape: ModelShape, card: Card, s: Setting, plan: Plan, replayed: bool | None = None
                ) -> tuple[list[Costs], list[float], float, int]:
    """Per stage (pp x v of them): the costs of one micro-batch's F, B, I, W; its merged weight gradient (all
    micro-batches at once, under --merge-wgrad); the MP time a step exposes; the MP all-reduces per step.
    replayed: the stages run as CUDA graphs (None: wherever they may, `graphed`): F, B and I replayed, W (a
    zero-bubble schedule's weight gradients, computed from the I's stashes) eager as ever."""
    replayed = graphed(shape, card, s, plan) if replayed is None else replayed
    costs, merged, mp_s, mp_count = action_costs(shape, card, s, plan, replayed)
    if replayed:
        eager, merged, _, _ = action_costs(shape, card, s, plan, replayed=False)
        costs = [Costs(F=c.F, B=c.B, I=c.I, W=e.W) for c, e in zip(costs, eager)]
    return costs, merged, mp_s, mp_count


def action_costs(shape: ModelShape, card: Card, s: Setting, plan: Plan, replayed: bool
                 ) -> tuple[list[Costs], list[float], float, int]:
    """stage_costs with every action replayed or every action eager."""
    m, mp, e = plan.micro_batches, s.mp, s.elem
    slow = 1.0 if shape.native else AUTOGRAD_SLOWDOWN
    tokens = s.per_dp / m * shape.tokens_per_sample  # a cp rank's share of each sequence (context.py)
    costs, merged, mp_s, mp_count = [], [], 0.0, 0
    kernel = card.blocks_kernel(s.cp_kernel) if s.cp > 1 else None  # None: one SDPA call a layer
    block_forward, block_backward = BLOCK_BYTES.get(kernel, BLOCK_BYTES["flash"])
    for layers in shape.cut(s.pp * plan.virtual_stages, s.pp, schedule_placement(plan.schedule)):
        # replayed: one graph launch an action, no host work a layer
        f = i = card.action_overhead_s if replayed else 0.0
        w = wm = 0.0
        for index in layers:
            before = (f, i, w, wm)
            layer = shape.layer(index)
            flops = 2.0 * layer.matmul_params / mp * tokens
            gemm = sum(gemm_pass_s(card, layer, s, tokens, reads_weights=True))
            attention = card.attention_s(layer.attention_flops / mp * tokens, s.half, kernel)
            elementwise = 2 * (layer.act_split / mp + layer.act_whole) * tokens * e / card.hbm_bytes_s
            overhead = 0.0 if replayed else card.host_action_s if card.host_action_s is not None else \
                card.action_overhead_s + (0.0 if shape.native else AUTOGRAD_ACTION_S)
            scale = slow * card.compute_scale
            f += scale * (gemm + attention + elementwise) + overhead
            i += scale * (gemm + ATTENTION_BACKWARD * attention + elementwise) + overhead
            if layer.fp8 is not None:  # quantization, the weight gradients' addition, the maxima's all-reduces
                work = fp8_work(layer.fp8, card, s, tokens, m)
                f += scale * work.forward_s + work.forward_reductions * reduction_s(card, mp)
                i += scale * work.backward_s + work.backward_reductions * reduction_s(card, mp)
            kv = kv_choice(card, s, layer, tokens, scale)
            if kv is not None:  # the K/V transfers the blocks' attention does not hide, and the blocks' merges
                blocks = (s.cp if kv.name == "ring" else 2) * tokens * shape.hidden / mp / card.hbm_bytes_s
                f += kv.cost.forward_s + scale * block_forward * blocks
                i += kv.cost.backward_s + scale * block_backward * blocks
            w_half, w_fp8 = gemm_pass_s(card, layer, s, tokens, reads_weights=False)
            i += scale * w_fp8  # an fp8 layer computes its weight gradient in its backward, never deferred
            if w_half:
                w_gemm = w_half * card.compute_scale
                if shape.native:
                    accumulate = layer.matmul_params / mp * (ACCUMULATE_BYTES * (m - 1) + 4.0) / m / card.hbm_bytes_s
                    w += w_gemm + card.compute_scale * accumulate + overhead
                    wm += card.compute_scale * (card.gemm_s(flops * m, tokens * m, 0.0, s.half) + 4.0 *
                                                layer.matmul_params / mp / card.hbm_bytes_s) + overhead
                else:
                    w += slow * w_gemm + overhead
                    wm += m * (slow * w_gemm + overhead)
            if mp > 1 and layer.mp_allreduces:
                forward, backward, exposed, count = mp_collectives_s(card, s, layer, tokens * shape.hidden * e,
                                                                     shape.native)
                f += forward
                i += backward
                mp_s += exposed * m
                mp_count += count * m
            if layer.host_ops[0] and not (replayed or shape.native) and card.host_action_s is None:
                f, i, w, wm = host_floor(card, layer, before, (f, i, w, wm), m, mp_waits(card, s, layer))
        if s.full_recompute:
            i += f
        if plan.merge_wgrad:
            costs.append(Costs(F=f, B=i, I=i, W=0.0))
            merged.append(wm)
        else:
            costs.append(Costs(F=f, B=i + w, I=i, W=w))
            merged.append(0.0)
    return costs, merged, mp_s, mp_count


def host_floor(card: Card, layer, before: tuple[float, ...], after: tuple[float, ...], micro_batches: int,
               waits: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, float, float]:
    """An autograd stage's F, I, W and merged W once this layer's actions last at least as long as the host takes
    to issue their operators (LayerShape.host_ops x Card.op_host_s), the GPU then waiting for the host. I issues
    the backward's operators less the weight gradients', W those, and a merged W (an autograd stage's weight
    gradients of every micro-batch, at the step's end) those of each micro-batch. waits: the forward's and the
    backward's MP synchronisation (mp_waits), which a host-paced rank pays beside its operators. A run's measured
    host cost a layer action (Card.host_action_s, refit.py) stands for the host instead: no floor then."""
    (f0, i0, w0, wm0), (f, i, w, wm) = before, after
    forward_ops, backward_ops, input_ops = (n * card.op_host_s for n in layer.host_ops)
    weight_ops = backward_ops - input_ops
    return (f0 + max(f - f0, forward_ops + waits[0]), i0 + max(i - i0, input_ops + waits[1]),
            w0 + max(w - w0, weight_ops), wm0 + max(wm - wm0, micro_batches * weight_ops))


def mp_waits(card: Card, s: Setting, layer) -> tuple[float, float]:
    """What a layer's MP collectives wait for the slowest rank of the group to reach them (Card.mp_sync_s), in its
    forward and its backward: the hosts' pace, not the transfers', so it adds to the host's floor. Under sequence
    parallelism twice the collectives, and the backward's all-reduces of the sequence-chunk parameters."""
    if s.mp == 1 or not layer.mp_allreduces:
        return 0.0, 0.0
    sync = (s.mp - 1) * card.mp_sync_s
    if not s.sequence_parallel:
        return layer.mp_allreduces * sync, layer.mp_allreduces * sync
    return 2 * layer.mp_allreduces * sync, (2 * layer.mp_allreduces + layer.sequence_params) * sync


def mp_collectives_s(card: Card, s: Setting, layer, nbytes: float, native: bool) -> tuple[float, float, float, int]:
    """A layer's MP collectives on one micro-batch of `nbytes` of hidden vectors: (what its forward waits for, what
    its backward waits for, the two's transfers and waits as the step's MP time, how many collectives).

    Each all-reduce: the forward waits for it; a native backward hides its transfer under the W GEMMs, never its
    synchronisation (Card.mp_sync_s: every rank waits for the slowest to reach it). Under sequence parallelism
    (parallel/tensor/sequence_parallel.py, csrc/tp/sequence_region.cpp) each becomes an all-gather before the
    column-parallel GEMMs and a reduce-scatter after the row-parallel one, forward and backward alike: the same
    bytes in twice the collectives, each waited for and each paying the synchronisation; each moves its tensor
    once more through memory (the [p, b, s/p, ...] slab copy a reduce-scatter reads, the gathered slabs made
    contiguous for the GEMM after an all-gather); and every backward all-reduces the gradient of each parameter
    used on a sequence chunk (LayerShape.sequence_params: a few kB each, their latency and synchronisation)."""
    mp = s.mp
    slow = 1.0 if native else AUTOGRAD_MP_SLOWDOWN
    forward_wait, backward_wait = mp_waits(card, s, layer)
    if not s.sequence_parallel:
        one = card.collective_s(nbytes, mp) * slow
        # native: the all-reduce's transfer hidden under the W GEMMs, never its synchronisation
        backward = layer.mp_allreduces * one / (2 if native else 1) + backward_wait
        return (layer.mp_allreduces * one + forward_wait, backward,
                1.5 * layer.mp_allreduces * one + forward_wait + backward_wait, round(2 * layer.mp_allreduces))
    half = card.collective_s(nbytes, mp, 1.0) * slow + card.compute_scale * 2.0 * nbytes / card.hbm_bytes_s
    forward = 2 * layer.mp_allreduces * half + forward_wait
    params = layer.sequence_params * card.collective_s(0.0, mp) * slow
    backward = 2 * layer.mp_allreduces * half / (2 if native else 1) + params + backward_wait
    return forward, backward, forward + backward, round(4 * layer.mp_allreduces) + layer.sequence_params


# ZeRO-2/3 without a pipeline move the gradients (and ZeRO-3 the weights) once per micro-batch, and those
# collectives are not hidden behind the next micro-batch's compute: measured on 4 x H200 (the 8B at dp4, 4
# micro-batches; experiments/results/2026-11-27-4xH200-zero-sharding.json) zero 2's step is 154 ms longer than
# zero 1's against ~200 ms of extra reduce-scatters, zero 3's 419 ms against ~430 of reduce-scatters and gathers.


def kv_choice(card: Card, s: Setting, layer, tokens: float, scale: float) -> CommChoice | None:
    """The K/V transfer variant of a layer's attention on a cp rank and its costs (None without cp or attention);
    scale: the layer's compute time over the card's."""
    if s.cp == 1 or not layer.attention_flops:
        return None
    attention = scale * card.attention_s(layer.attention_flops / s.mp * tokens, s.half, card.blocks_kernel(s.cp_kernel))
    return choose_comm(s.cp_comm, card, KvTraffic(s.cp, tokens, layer.kv_width / s.mp, s.elem, attention))


def zero3_gather_exposed_s(card: Card, s: Setting, params: float, compute_s: float, layers: int,
                           micro_batches: int) -> float:
    """ZeRO-3's all-gathers of the half weights beyond ZeRO-1's one after the update. Under a pipeline the stage
    stays gathered for the step: one gather, of which the compute hides all but the first layer's. Without one,
    every bucket is gathered before each micro-batch's forward and again before its backward: 2m gathers, the
    first hidden as under a pipeline and the other 2m - 1 exposed (the measurement above)."""
    gather = card.collective_s(params * s.elem, s.shard_size, 1.0)
    first = max(0.0, gather - compute_s) + gather / max(layers, 1)
    return first if s.pp > 1 else first + (2 * micro_batches - 1) * gather


def rank_params(shape: ModelShape, s: Setting, virtual_stages: int, placement: str = "loop") -> list[float]:
    """Parameters held by each pipeline rank (its share of MP)."""
    out = [0.0] * s.pp
    num_stages = s.pp * virtual_stages
    for stage, layers in enumerate(shape.cut(num_stages, s.pp, placement)):
        out[stage_rank(stage, s.pp, num_stages, placement)] += sum(shape.layer(i).params for i in layers) / s.mp
    return out


def step_time(shape: ModelShape, card: Card, s: Setting, plan: Plan) -> StepTime:
    """The predicted time of one step of `plan` on `card` (the slowest rank's): with its stages replayed as CUDA
    graphs where they may be (--cuda-graphs on), or whichever of replayed and eager is faster (auto: what the run
    then chooses, parallel/pipeline/graphs.py)."""
    if not graphed(shape, card, s, plan):
        return timed(shape, card, s, plan, replayed=False)
    replayed = timed(shape, card, s, plan, replayed=True)
    if s.cuda_graphs == "on":
        return replayed
    eager = timed(shape, card, s, plan, replayed=False)
    return replayed if replayed.step_s <= eager.step_s else eager


def timed(shape: ModelShape, card: Card, s: Setting, plan: Plan, replayed: bool) -> StepTime:
    """The predicted step with the stages replayed as CUDA graphs or eager."""
    costs, merged, mp_s, mp_count = stage_costs(shape, card, s, plan, replayed)
    tokens = s.per_dp / plan.micro_batches * shape.tokens_per_sample
    latency = card.hop_s(tokens * shape.hidden * s.elem) if s.pp > 1 else 0.0
    schedule = make_schedule(plan.schedule, s.pp, plan.micro_batches, plan.virtual_stages, plan.lookahead)
    split = splits_backward(schedule_of(plan), s.pp)
    placement = schedule_placement(plan.schedule)
    sim = simulate(schedule, Costs(latency=latency), stage_costs=costs, placement=placement)
    held = [rank_stages(r, s.pp, s.pp * plan.virtual_stages, placement) for r in range(s.pp)]
    per_rank_merged = [sum(merged[st] for st in held[r]) for r in range(s.pp)]
    params = rank_params(shape, s, plan.virtual_stages, placement)
    cut = shape.cut(s.pp * plan.virtual_stages, s.pp, placement)
    worst = 0.0
    dp_worst = update_worst = 0.0
    for r in range(s.pp):
        # what of the DP collectives the last backward hides: nothing of a replayed one (announced after it), the
        # eager W after a replayed I
        if not replayed:
            last_backward = sum(costs[st].B for st in held[r]) + per_rank_merged[r]
        else:
            last_backward = sum(costs[st].W for st in held[r]) if split else 0.0
        dp_s, dp_exposed = 0.0, 0.0
        if s.replicas > 1:  # the gradients summed over dp x cp
            nbytes = params[r] * s.grad_wire_bytes
            dp_s = card.collective_s(nbytes, s.replicas, 1.0 if s.zero else 2.0)
            last_bucket = dp_s * min(1.0, DP_BUCKET_BYTES / max(nbytes, 1.0))
            dp_exposed = max(dp_s - last_backward, last_bucket)
            if s.zero >= 2 and s.pp == 1:  # a reduce-scatter after every micro-batch (exposed: above)
                dp_exposed += (plan.micro_batches - 1) * dp_s
            if s.zero >= 3:
                layers = sum(len(cut[st]) for st in held[r])
                dp_exposed += zero3_gather_exposed_s(card, s, params[r], sim.makespan, layers, plan.micro_batches)
        per_param = (UPDATE_BYTES if s.half else UPDATE_BYTES_FP32).get(s.optimizer, 30.0)
        update = card.compute_scale * params[r] * (per_param / (s.shard_size if s.zero else 1) +
                                                   (4.0 if s.clip else 0.0)) / card.hbm_bytes_s
        if plan.micro_batches > 1 and not plan.merge_wgrad:
            update += card.compute_scale * 4.0 * params[r] / card.hbm_bytes_s  # the gradient buffer zeroed
        if s.replicas > 1 and s.zero:  # the updated half weights gathered from their shards, after the update
            dp_exposed += card.collective_s(params[r] * s.elem, s.shard_size, 1.0)
        total = sim.makespan + per_rank_merged[r] + dp_exposed + update + card.step_host_s
        if total > worst:
            worst, dp_worst, update_worst = total, dp_exposed, update
    attending = max(sum(1 for st in held[r] for i in cut[st] if shape.layer(i).attention_flops) for r in range(s.pp))
    kv, kv_s = context_exposed(shape, card, s, plan, tokens, attending)
    return StepTime(worst, sim.makespan + max(per_rank_merged), sim.bubble, dp_worst, mp_count, mp_s, update_worst,
                    sim, kv, kv_s, replayed)


def context_exposed(shape: ModelShape, card: Card, s: Setting, plan: Plan, tokens: float,
                    attending: int) -> tuple[CommChoice | None, float]:
    """(the K/V variant, what it exposes per step on a rank holding `attending` attention layers): every
    micro-batch's forward and backward (and the forward again under full recompute) of each."""
    layer = next((layer for layer in shape.layers if layer.attention_flops), None)
    if s.cp == 1 or layer is None:
        return None, 0.0
    kv = kv_choice(card, s, layer, tokens, (1.0 if shape.native else AUTOGRAD_SLOWDOWN) * card.compute_scale)
    per_layer = kv.cost.exposed_s + (kv.cost.forward_s if s.full_recompute else 0.0)
    return kv, per_layer * plan.micro_batches * attending
