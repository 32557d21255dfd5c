"""A model as the planner sees it (each model gives its own: ModelEntry.shape, models/entry.py): per layer (a module
of the engine's Sequential, or an MLP block), its parameters, its FLOPs and the bytes it keeps, from the run's model
options alone (nothing is built).

Activation counts are per token (a sample of the MLP is one token), in elements of the activation dtype; the
decoders' follow Megatron's accounting (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models": 34 s h bytes per layer at half precision with a fused attention core, i.e. 17 h elements),
of which the part before and after the MP region (LayerNorms, residual: 5 h elements) stays whole on every MP rank.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Fp8Gemms:
    """A layer's linear layers whose three GEMMs run in float8 (fp8/matmul.py; kernels/apply.py converts a block's),
    each as (in features K, out features N) of the whole layer: column-parallel ones split N over MP, row-parallel
    ones K. What the planner times of them: planner/fp8_time.py."""

    recipe: str
    """tensorwise or rowwise (kernels/options.py FP8_RECIPES)."""
    weight_cache: bool
    """The weights quantized once a step into fp8's weight cache (fp8/weight_cache.py), else every micro-batch."""
    column: tuple[tuple[int, int], ...]
    row: tuple[tuple[int, int], ...]

    @property
    def params(self) -> int:
        """Their weight parameters, whole."""
        return sum(k * n for k, n in self.column + self.row)

    def inputs(self, mp: int) -> float:
        """Elements of one token's inputs x that the layers quantize on an MP rank: a column-parallel layer's whole
        (its region entered before it), a row-parallel layer's split."""
        return sum(k for k, _ in self.column) + sum(k for k, _ in self.row) / mp

    def output_grads(self, mp: int) -> float:
        """Elements of one token's output gradients dy the layers quantize on an MP rank: a column-parallel layer's
        split, a row-parallel layer's whole (the gradient of the sum after it)."""
        return sum(n for _, n in self.column) / mp + sum(n for _, n in self.row)


@dataclass(frozen=True)
class LayerShape:
    """One layer: parameters (all, and those that are GEMM weights) and what one token costs and keeps."""

    params: int
    matmul_params: int
    attention_flops: float = 0.0
    """Forward FLOPs of the attention core per token (scores and weighted sum): causal_attention_flops."""
    kv_width: float = 0.0
    """K and V elements per token (2 x kv heads x head dim), split over MP: what context parallelism sends."""
    act_split: float = 0.0
    """Activation elements per token kept for the backward, split over MP."""
    act_whole: float = 0.0
    """Activation elements per token kept for the backward, whole on every MP rank."""
    stash: float = 0.0
    """Elements per token a merged weight gradient keeps until the step's end (the GEMMs' inputs and output
    gradients), split over MP."""
    mp_allreduces: float = 0.0
    """MP all-reduces of one token's hidden vector per forward (as many in the backward); under sequence parallelism
    each is an all-gather before the column-parallel GEMMs and a reduce-scatter after the row-parallel one."""
    sequence_params: int = 0
    """Parameter tensors used on a sequence chunk under sequence parallelism (replicated norms' weights and biases,
    row-parallel biases: parallel/tensor/sequence_parallel.py), each gradient all-reduced over MP in every
    backward."""
    loss_bytes: float = 0.0
    """Bytes per token of one micro-batch the loss keeps (loss_memory), split over MP."""
    loss_fixed: float = 0.0
    """Bytes one micro-batch's loss keeps whatever its tokens (loss_memory), split over MP."""
    fp8: Fp8Gemms | None = None
    """The layer's GEMMs that run in float8 (None: none do)."""
    host_ops: tuple[int, int, int] = (0, 0, 0)
    """Aten operators the layer dispatches a micro-batch, which the host issues one by one: forward, backward, and
    backward without its weight gradients (models/op_count.py); zeros: not counted (a native layer, compiled
    regions)."""

    @property
    def fp8_cache(self) -> float:
        """Bytes fp8's weight cache keeps for the layer from its first forward of a step to the step's end (both fp8
        layouts of each GEMM weight: 2 bytes a parameter; fp8/weight_cache.py), split over MP."""
        return 2.0 * self.fp8.params if self.fp8 is not None and self.fp8.weight_cache else 0.0


@dataclass(frozen=True)
class ModelShape:
    """The planner's view of a model: layers in order, the per-token width sent between stages, the data's
    bytes per sample, and how the engine cuts it into stages."""

    name: str
    layers: tuple[LayerShape, ...]
    hidden: int
    tokens_per_sample: int
    data_bytes: float
    """Bytes per sample of the data a step keeps (inputs on the first stage, targets on the last, each half)."""
    flops_per_sample: float
    native: bool = False
    """Stages run as the C++ native chain (the MLP); else through autograd, stage by stage in Python."""
    builtin_loss: bool = False
    """The run's loss is the engine's built-in MSE (models/losses.py), which a native last stage computes in C++
    (and a CUDA graph captures with its forward)."""
    cut: Callable[..., list[list[int]]] = field(repr=False, compare=False, default=None)
    """(num stages, pipeline ranks, placement) -> each stage's layers: indices, or units.Half for a block's half
    (the engine's own layout rule: the workload's)."""
    halves: dict = field(repr=False, compare=False, default_factory=dict)
    """A block's residual half, by part (units.Half.part): its LayerShape (halved)."""

    def layer(self, unit) -> LayerShape:
        """The LayerShape of a stage's entry (cut): a layer by index, or a block's half."""
        return self.layers[unit] if isinstance(unit, int) else self.halves[unit.part]

    @property
    def unit(self) -> str:
        return "tokens/s" if self.tokens_per_sample > 1 else "samples/s"


def planned_kernels(cfg):
    """The fused kernels a run of cfg (RunConfig of a decoder) gets where it is planned for: on the card
    --plan-card names (h100, h200: as there, from any machine), else on its --device, as the driver resolves them:
    KernelOptions (kernels/options.py)."""
    from hybrid_engine.train.cli import device_type

    return cfg.model.options.kernels(device_type(cfg.parallel.device), cfg.plan.card, cfg.parallel.mp,
                                     cfg.data_parallel.zero)


def planned_for_gpu(cfg) -> bool:
    """Whether cfg (RunConfig) is planned for a GPU's card (--plan-card, else its --device). Only a GPU's card
    times the host's cost a block's operators take (Card.op_host_s; the CPU's card none), so a block's operators
    are counted (models/op_count.py) only for one: the count runs under a TorchDispatchMode, whose first use
    imports torch's compiler stack, about a second of every planning process's start on a CPU."""
    from hybrid_engine.planner.card import names_a_gpu
    from hybrid_engine.train.cli import device_type

    return names_a_gpu(cfg.plan.card, device_type(cfg.parallel.device))


def fp8_gemms(kernels, column: list[tuple[int, int]], row: list[tuple[int, int]]) -> Fp8Gemms | None:
    """A block's linear layers (column- and row-parallel, each (K, N)) as they run under these KernelOptions: in
    float8 with its recipe and weight cache, or None without fp8."""
    if kernels.fp8 is None:
        return None
    return Fp8Gemms(kernels.fp8, kernels.fp8_weight_cache, tuple(column), tuple(row))


def attention_core_flops(seq_len: int, width: int) -> float:
    """Forward FLOPs of one token's attention core against a sequence of seq_len keys, over `width` query
    features (heads x head dim): its scores and its weighted sum, 2 FLOPs a multiply-add each."""
    return 4.0 * seq_len * width


def causal_attention_flops(seq_len: int, width: int) -> float:
    """Forward FLOPs of one token's causal attention core, what a flash kernel computes on average: a token sees
    the keys up to itself, half of a sequence of seq_len on average, and the kernel skips the blocks the mask
    hides (the model's FLOPs, models/*/flops.py, count the whole square by convention)."""
    return attention_core_flops(seq_len, width) / 2


def loss_memory(vocab: int, hidden: int, fused: bool) -> tuple[float, float]:
    """(bytes a token, bytes whatever the tokens) one micro-batch's loss keeps at its peak, half weights. Unfused:
    the half logits and their fp32 softmax, 6 bytes a vocabulary entry. The chunked linear + cross-entropy
    (kernels/linear_cross_entropy.py): the input's gradient and the input itself (2 bytes a hidden element each),
    and either the chunks' half logit gradients or the head's fp32 weight gradient, computed in the forward and
    kept for the backward (the loss keeps the gradients only where they are no larger than the weight gradient's
    4 bytes a weight, which bounds both), beside the larger of one chunk's half logits and their gradient
    (CHUNK_BYTES, in the forward) and the weight gradient in half (in the backward)."""
    if not fused:
        return 6.0 * vocab, 0.0
    from hybrid_engine.kernels.linear_cross_entropy import CHUNK_BYTES

    weight = vocab * hidden
    return 4.0 * hidden, 4.0 * weight + max(CHUNK_BYTES, 2.0 * weight)


def decoder_shape(name: str, layers: int, hidden: int, seq_len: int, vocab: int, block_params: int,
                  ffn_hidden: int, tied: bool, costs: list[float], flops_per_token: float,
                  positions: int = 0, block_acts: tuple[float, float] | None = None,
                  kv_width: int | None = None, fused_loss: bool = False, fp8: Fp8Gemms | None = None,
                  sequence_params: int = 0, host_ops: tuple[int, int, int] = (0, 0, 0),
                  half_shares: tuple[float, float] = (0.5, 0.5), split_blocks: str = "off") -> ModelShape:
    """A decoder (the GPT or the Llama): embedding, blocks, head; stages cut by balanced_partition(costs).
    positions: rows of a learned position table beside the token embedding (the GPT's; 0: none, RoPE).
    block_acts: (split over MP, whole) activation elements a block keeps per token (default Megatron's 12 h, 5 h).
    kv_width: K and V elements per token (default 2 h: as many kv heads as query heads).
    fused_loss: the run's loss is the chunked linear + cross-entropy (loss_memory).
    fp8: a block's linear layers in float8 (fp8_gemms; None: none).
    sequence_params: a block's parameter tensors used on a sequence chunk under sequence parallelism.
    host_ops: a block's aten operators a micro-batch (LayerShape.host_ops).
    half_shares: the shares of a block's cost of its attention and MLP halves; split_blocks: the run's
    StageConfig.split_blocks (stages may end between them: parallel/pipeline/units.py)."""
    from hybrid_engine.parallel.pipeline.units import place

    h = hidden
    act_split, act_whole = block_acts or (12 * h, 5 * h)
    embedding = LayerShape(params=(vocab + positions) * h, matmul_params=0, act_whole=h)
    kv_width = 2 * h if kv_width is None else kv_width
    block = LayerShape(params=block_params, matmul_params=block_params,
                       attention_flops=causal_attention_flops(seq_len, h), kv_width=kv_width,
                       act_split=act_split, act_whole=act_whole, stash=8 * h + 2 * ffn_hidden, mp_allreduces=2,
                       sequence_params=sequence_params, host_ops=host_ops, fp8=fp8)
    per_token, fixed = loss_memory(vocab, h, fused_loss)
    head = LayerShape(params=0 if tied else vocab * h, matmul_params=vocab * h, act_whole=2 * h,
                      stash=h + vocab, loss_bytes=per_token, loss_fixed=fixed)
    parts = dict(zip(("attention", "mlp"), half_shares))
    halves = {i: tuple(parts) for i in range(1, layers + 1)}
    return ModelShape(name, (embedding, *(block,) * layers, head), h, seq_len, data_bytes=16.0 * seq_len,
                      flops_per_sample=flops_per_token * seq_len,
                      cut=lambda n, pp=None, placement="loop": place(costs, halves, half_shares, n, pp, placement,
                                                                   split_blocks),
                      halves={part: halved(block, part, share) for part, share in parts.items()})


def halved(block: LayerShape, part: str, share: float) -> LayerShape:
    """One residual half of a block (parallel/pipeline/units.py): its share of the block's cost (half_costs) of
    everything it holds and keeps, the attention core's FLOPs and K/V on the attention half only, one MP
    all-reduce each, and its own fp8 GEMMs."""
    attention = part == "attention"
    fp8 = block.fp8
    if fp8 is not None:  # each half closes with its row-parallel GEMM; the MLP's column GEMMs feed its own
        mlp_width = fp8.row[-1][0]
        fp8 = dataclasses.replace(fp8, column=tuple(g for g in fp8.column if (g[1] == mlp_width) != attention),
                                  row=fp8.row[:1] if attention else fp8.row[1:])
    return dataclasses.replace(
        block, params=round(block.params * share), matmul_params=round(block.matmul_params * share),
        attention_flops=block.attention_flops if attention else 0.0, kv_width=block.kv_width if attention else 0.0,
        act_split=block.act_split * share, act_whole=block.act_whole * share, stash=block.stash * share,
        mp_allreduces=block.mp_allreduces / 2, sequence_params=round(block.sequence_params / 2),
        host_ops=tuple(round(n * share) for n in block.host_ops), fp8=fp8)
