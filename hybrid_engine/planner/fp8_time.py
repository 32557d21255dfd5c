"""What a layer's float8 linear layers cost in the step model (models/planner_shape.Fp8Gemms): their three GEMMs per
micro-batch at the card's fp8 rate (Card.fp8_flops), and the work around them that bf16 GEMMs do not have, as the
code does it (fp8/matmul.py, fp8/quantize.py, fp8/weight_cache.py), timed as memory traffic at the card's bandwidth.

Bytes an element, `elem` the bytes of a half value:
  an operand two GEMMs read, quantized in both layouts at once (Quantizer.both: x in the forward, dy at the
  backward's start, a weight into the cache): each absolute maximum a reduction pass of its own over the operand
  (its cast needs the finished maximum), one tensor-wise and two row-wise (along each GEMM's contracted dimension);
  then the casts, reading it once and writing one byte a value in each layout:
      tensor-wise 2 elem + 2, row-wise 3 elem + 2 (6 and 8 bytes in bf16)
  an operand one GEMM reads (a weight without the cache: for the forward, and again for the input gradient): its
  maximum and its cast, 2 elem + 1
  the weight gradient: torch._scaled_mm writes it in bf16 and the engine's gradient hook adds it into the fp32 main
  grad (docs/kernels.md), elem read + 4 read + 4 written a parameter each micro-batch, where a bf16 GEMM accumulates
  into the main grad itself.
Per micro-batch: every x in the forward, every dy in the backward, the weights in both (or once a step with the
cache, counted a micro-batch's share in each forward), the weight gradients' addition in the backward, where the
fp8 weight-gradient GEMM runs too: an fp8 layer computes it in its own backward, never in a deferred W action. The
quantization's passes run at the share of the bandwidth they were measured at (QUANTIZE_EFFICIENCY), the addition
(one vectorized kernel) at the card's.

Under tensor parallelism each operand is the rank's (Fp8Gemms.inputs, output_grads), and each maximum over a
dimension MP splits is all-reduced over the MP group before its cast (matmul.operand_groups): x of a row-parallel
layer, dy of a column-parallel one, and a weight's per quantization (tensor-wise: every weight's; row-wise: a
row-parallel weight's forward form and a column-parallel weight's input-gradient form). Each moves 4 bytes a scale
(a tensor's, or a row's): its cost is the collective's latency and the group's synchronisation (Card.mp_sync_s a
rank)."""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.models.planner_shape import Fp8Gemms, LayerShape

from .card import Card
from .setting import Setting

MAIN_GRAD_BYTES = 4.0  # the fp32 main grad the fp8 weight gradient is added into
# The quantization's passes (ATen's maxima, fp8/gpu_cast.py's casts) over the card's bandwidth: an H200 profile of
# the 8B layer shape cut to 4 layers, tensor-wise, moved the ~266 GB these byte counts give in 159.8 ms of maxima
# and casts, 1.66 TB/s of the table's 4.2 (results/2026-11-27-4xH200-fp8-kernels-profile-categories.json).
QUANTIZE_EFFICIENCY = 0.4


@dataclass(frozen=True)
class Fp8Work:
    """A layer's fp8 work beside its GEMMs, per micro-batch on one MP rank."""

    forward_s: float
    """The forward's quantization (x, and the weights or their share of the step's once)."""
    backward_s: float
    """The backward's: dy, the weights without the cache, the weight gradients added into the main grads."""
    forward_reductions: float
    """MP all-reduces of maxima in the forward (a share where the cache quantizes once a step)."""
    backward_reductions: float


def both_layouts_bytes(recipe: str, elem: float) -> float:
    """Bytes an element of quantizing an operand in both layouts at once (Quantizer.both)."""
    maxima = 1 if recipe == "tensorwise" else 2
    return maxima * elem + elem + 2.0


def one_layout_bytes(elem: float) -> float:
    """Bytes an element of quantizing an operand for one GEMM (its maximum, its cast)."""
    return 2.0 * elem + 1.0


def fp8_work(fp8: Fp8Gemms, card: Card, s: Setting, tokens: float, micro_batches: int) -> Fp8Work:
    """The fp8 work of a layer's linear layers at `tokens` tokens a micro-batch, with `micro_batches` a step."""
    mp, elem = s.mp, s.elem
    both = both_layouts_bytes(fp8.recipe, elem)
    params = fp8.params / mp
    if fp8.weight_cache:  # both forms once a step, at the step's first forward
        weights_forward, weights_backward = both * params / micro_batches, 0.0
    else:  # the forward's form, and the input gradient's, every micro-batch
        weights_forward = weights_backward = one_layout_bytes(elem) * params
    quantize = card.hbm_bytes_s * QUANTIZE_EFFICIENCY
    forward = (tokens * fp8.inputs(mp) * both + weights_forward) / quantize
    backward = ((tokens * fp8.output_grads(mp) * both + weights_backward) / quantize +
                (elem + 2 * MAIN_GRAD_BYTES) * params / card.hbm_bytes_s)
    reduce_forward = reduce_backward = 0.0
    if mp > 1:
        layers, column, row = len(fp8.column) + len(fp8.row), len(fp8.column), len(fp8.row)
        tensorwise = fp8.recipe == "tensorwise"
        reduce_forward, reduce_backward = float(row), float(column)  # x of the row-parallel, dy of the column
        if fp8.weight_cache:  # one maximum split over MP a weight, tensor-wise and row-wise
            reduce_forward += layers / micro_batches
        else:
            reduce_forward += layers if tensorwise else row
            reduce_backward += layers if tensorwise else column
    return Fp8Work(forward, backward, reduce_forward, reduce_backward)


def reduction_s(card: Card, mp: int) -> float:
    """One all-reduce of maxima over the MP group: its latency and the group's synchronisation."""
    return card.collective_s(0.0, mp) + (mp - 1) * card.mp_sync_s


def gemm_pass_s(card: Card, layer: LayerShape, s: Setting, tokens: float, reads_weights: bool) -> tuple[float, float]:
    """One of a layer's three GEMM passes (the forward, the input gradient, the weight gradient) over `tokens` rows
    on an MP rank: (its half-precision GEMMs' time, its fp8 GEMMs' time). reads_weights: bounded also by reading
    the weights (the forward and the input gradient: 1 byte a parameter in fp8)."""
    low = layer.fp8.params if layer.fp8 is not None else 0
    high = max(0, layer.matmul_params - low)
    half = card.gemm_s(2.0 * high / s.mp * tokens, tokens, s.elem * high / s.mp if reads_weights else 0.0,
                       s.half) if high else 0.0
    fp8 = card.gemm_s(2.0 * low / s.mp * tokens, tokens, low / s.mp if reads_weights else 0.0, s.half,
                      fp8=True) if low else 0.0
    return half, fp8
