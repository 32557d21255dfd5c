"""A decoder-only transformer (GPT-2 shape, Radford et al. 2019) as an nn.Sequential of pipeline-cuttable layers,
plain PyTorch (nn.Linear, LayerNorm, SDPA) that knows nothing of ranks; parallelize.py makes it tensor- and
sequence-parallel from outside:

    Embedding   tokens [b, s] int64      -> hidden [b, s, h]   learned token + position embeddings
    Block x L   hidden [b, s, h]         -> hidden [b, s, h]   pre-LayerNorm causal self-attention + GELU MLP (4h)
    Head        hidden [b, s, h]         -> logits [b, s, V]   final LayerNorm + LM head (no bias)

The loss (cross-entropy over next tokens, mean over tokens) is not a layer: the last stage applies
`gpt_loss` (dense) or `vocab_parallel_cross_entropy` (parallel/tensor/vocab_cross_entropy.py: vocabulary
split over MP) to the logits. A block reads its heads from its projection's shape, so one whose projections were
split over MP runs its rank's heads unchanged.

Grid invariance: every layer draws all its weights from its own generator seeded by (seed, layer index), on its
own device (`full_weights`, models/init.py), so a layer's initial weights depend on the seed alone; a layer split
over MP draws the same full tensors and keeps its rank's slices. Built on the meta device a layer costs nothing
until materialized, and `models.materialize` initialises each layer exactly once, by the layer.

Initialisation follows GPT-2 / Megatron: weights N(0, 0.02), the two residual output projections (attention
output, MLP fc2) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm 1 and 0. With `tie_embeddings` the head's weight
is drawn from the embedding's generator, so it starts equal to the token embedding; the two are still separate
parameters (they may sit on different pipeline stages), both tagged `param.tied = "word_embeddings"` by the
parallelize plan: whoever trains the model must sum their gradients before the update (Megatron's embedding
all-reduce between the first and last stage), after which they stay equal.

No QKV bias (as in PaLM, LLaMA, Megatron's default add_qkv_bias=False): the key bias has an exactly zero true
gradient (it shifts every score of a query by the same amount, and softmax ignores that), so its computed
gradient is rounding noise that Adam normalises into lr-sized updates which differ from grid to grid -- it
would break the rule that every grid reproduces the 1-rank weights, and it models nothing. The other
projections keep their biases, as in GPT-2.

QKV layout: the fused QKV projection's output features are ordered (head, {q, k, v}, head_dim), Megatron's
layout, so that a contiguous row slice of the weight holds whole heads with their q, k and v (column-parallel
with whole heads per rank needs no reshuffle, and a gathered checkpoint is this dense layout on every grid).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid_engine.models.decoder import (INIT_STD, TIED_EMBEDDINGS, Dense, TokenLookup, draw_full, generate,
                                          maybe_recompute)
from hybrid_engine.models.decoder import next_token_loss as gpt_loss
from hybrid_engine.models.init import _generator, init_layer, stream_seed

__all__ = [
    "GPTConfig",
    "Dense",
    "LayerNorm",
    "layer_norm",
    "residual_stream",
    "Embedding",
    "Block",
    "Head",
    "PositionRows",
    "dense_gpt",
    "gpt_loss",
    "causal_attention",
    "layer_costs",
    "generate",
    "TIED_EMBEDDINGS",
]

SEED_STREAMS = (4,)  # the stream the registry (models/registry.py) gives it, after the MLP's
LN_EPS = 1e-5


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT. The vocabulary comes from the data (`TokenDataset.vocab_size`)."""

    vocab_size: int
    layers: int
    hidden: int
    heads: int
    seq_len: int
    tie_embeddings: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "layers", "hidden", "heads", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPT {name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"GPT hidden {self.hidden} is not divisible by heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_layers(self) -> int:
        """Modules of the nn.Sequential: embedding, blocks, head."""
        return self.layers + 2

    @property
    def context(self) -> int:
        """The longest sequence the model takes (its position table)."""
        return self.seq_len


def layer_seed(cfg: GPTConfig, index: int) -> int:
    """Seed of the generator that initialises module `index` of the Sequential (0 embedding, 1..L blocks, L+1 head)."""
    return stream_seed(cfg.seed, SEED_STREAMS[0], index)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension (eps 1e-5) with no initialisation of its own; its parameters may be handed
    in (a sequence-parallel norm hands it the views whose gradients are summed over MP)."""

    def __init__(self, dim: int, *, device=None, dtype=None):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return layer_norm(x, self.weight if weight is None else weight, self.bias if bias is None else bias)


class PositionRows(nn.Module):
    """rows(table, s): the first s rows of a position table (the part a sequence-parallel plan swaps for this
    rank's chunk of them)."""

    def forward(self, table: torch.Tensor, length: int) -> torch.Tensor:
        return table[:length]


def causal_attention(qkv: torch.Tensor, heads: int, context=None) -> torch.Tensor:
    """[b, s, heads * 3 * d] in (head, {q, k, v}, d) order -> causal SDPA -> [b, s, heads * d]; with a context
    (parallel/context.ContextParallel) the s tokens are this rank's, attending over the whole sequence."""
    b, s, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)  # each [b, heads, s, d]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if context is None else context.attention(q, k, v)
    return y.transpose(1, 2).reshape(b, s, heads * d)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dimension, normalised in x's precision, returned in the parameters' dtype (what the
    GEMM after it reads). The two differ only under an fp32 residual stream with half weights (`fp32_residual`):
    the fp32 stream is normalised in fp32 with the half parameters widened, then rounded to half once."""
    if x.dtype == weight.dtype:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, LN_EPS)
    return F.layer_norm(x, (x.shape[-1],), weight.to(x.dtype), bias.to(x.dtype), LN_EPS).to(weight.dtype)


def residual_stream(x: torch.Tensor, fp32: bool) -> torch.Tensor:
    """The embedding's output as the residual stream carries it: in fp32 when `fp32` (each block's output then
    stays fp32, as fp32 + half promotes), else as computed."""
    return x.float() if fp32 else x


class Embedding(nn.Module):
    """tokens [b, s] int64 -> word[tokens] + position[:s], [b, s, h]. Module 0 of the Sequential."""

    index = 0
    # Megatron's fp32_residual_connection: under half weights the residual stream -- this layer's output, every
    # block's input and output, the head's input, the activations between pipeline stages -- stays fp32, so the
    # blocks' updates are not rounded to half as they are added. Set by whoever builds the stage.
    fp32_residual = False

    def __init__(self, cfg: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        factory = {"device": device, "dtype": dtype}
        self.word = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden, **factory))
        self.position = nn.Parameter(torch.empty(cfg.seq_len, cfg.hidden, **factory))
        self.lookup, self.positions = TokenLookup(), PositionRows()
        self.reset_parameters()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        """The layer's full initial tensors, drawn from its generator in a fixed order."""
        gen = _generator(torch.device(device), layer_seed(self.cfg, self.index))
        word = draw_full((self.cfg.vocab_size, self.cfg.hidden), INIT_STD, gen, device, dtype)
        position = draw_full((self.cfg.seq_len, self.cfg.hidden), INIT_STD, gen, device, dtype)
        return {"word": word, "position": position}

    def reset_parameters(self) -> None:
        init_layer(self)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] > self.cfg.seq_len:
            raise ValueError(f"GPT Embedding: tokens must be [batch, seq <= {self.cfg.seq_len}], got "
                             f"{tuple(tokens.shape)}")
        word, position = self.lookup(tokens, self.word), self.positions(self.position, tokens.shape[1])
        return residual_stream(word, self.fp32_residual) + residual_stream(position, self.fp32_residual)


class Block(nn.Module):
    """x + proj(attention(ln1(x))), then + fc2(gelu(fc1(ln2(x)))). Modules 1..L of the Sequential."""

    # Selective recompute (Korthikanti et al. 2022, Megatron's --recompute-granularity selective): keep every
    # activation but the attention core's, recomputed in backward. Set per block by whoever builds the stage.
    recompute_attention_core = False
    # Context parallelism (parallel/context): attention over the whole sequence from this rank's tokens; None:
    # the block holds whole sequences. (The embedding's position lookup is made context-parallel from outside.)
    context_parallel = None
    # The residual branches, in forward order, and what each reads: a pipeline may cut between them
    # (parallel/pipeline/units.py)
    RESIDUAL_HALVES = {"attention": ("ln1", "attn_qkv", "attn_proj"), "mlp": ("ln2", "mlp_fc1", "mlp_fc2")}

    def __init__(self, cfg: GPTConfig, index: int, *, device=None, dtype=None):
        super().__init__()
        if not 1 <= index <= cfg.layers:
            raise ValueError(f"GPT block index must be in [1, {cfg.layers}], got {index}")
        self.cfg, self.index = cfg, index
        h = cfg.hidden
        factory = {"device": device, "dtype": dtype}
        self.ln1 = LayerNorm(h, **factory)
        self.attn_qkv = Dense(h, 3 * h, bias=False, **factory)
        self.attn_proj = Dense(h, h, **factory)
        self.ln2 = LayerNorm(h, **factory)
        self.mlp_fc1 = Dense(h, 4 * h, **factory)
        self.mlp_fc2 = Dense(4 * h, h, **factory)
        self.reset_parameters()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        """Full initial weights: the four projections drawn in a fixed order; biases 0, LayerNorms identity."""
        h, std = self.cfg.hidden, INIT_STD
        out_std = INIT_STD / math.sqrt(2 * self.cfg.layers)
        gen = _generator(torch.device(device), layer_seed(self.cfg, self.index))
        full = {
            "attn_qkv.weight": draw_full((3 * h, h), std, gen, device, dtype),
            "attn_proj.weight": draw_full((h, h), out_std, gen, device, dtype),
            "mlp_fc1.weight": draw_full((4 * h, h), std, gen, device, dtype),
            "mlp_fc2.weight": draw_full((h, 4 * h), out_std, gen, device, dtype),
        }
        zeros = {n: torch.zeros(size, device=device, dtype=dtype)
                 for n, size in (("attn_proj.bias", h), ("mlp_fc1.bias", 4 * h), ("mlp_fc2.bias", h),
                                 ("ln1.bias", h), ("ln2.bias", h))}
        ones = {n: torch.ones(h, device=device, dtype=dtype) for n in ("ln1.weight", "ln2.weight")}
        return full | zeros | ones

    def reset_parameters(self) -> None:
        init_layer(self)

    def attention_core(self, qkv: torch.Tensor) -> torch.Tensor:
        heads = qkv.shape[-1] // (3 * self.cfg.head_dim)  # this block's heads: all, or its rank's
        return maybe_recompute(self.recompute_attention_core, causal_attention, qkv, heads, self.context_parallel)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn_proj(self.attention_core(self.attn_qkv(self.ln1(x))))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_fc2(F.gelu(self.mlp_fc1(self.ln2(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)


class Head(nn.Module):
    """hidden [b, s, h] -> final LayerNorm -> LM head (no bias) -> logits [b, s, V]. Module L+1 of the Sequential."""

    def __init__(self, cfg: GPTConfig, *, device=None, dtype=None):
        super().__init__()
        self.cfg, self.index = cfg, cfg.layers + 1
        factory = {"device": device, "dtype": dtype}
        self.ln_f = LayerNorm(cfg.hidden, **factory)
        self.lm_head = Dense(cfg.hidden, cfg.vocab_size, bias=False, **factory)
        self.reset_parameters()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        if self.cfg.tie_embeddings:  # the embedding's first draw: the token embedding itself
            gen = _generator(torch.device(device), layer_seed(self.cfg, Embedding.index))
        else:
            gen = _generator(torch.device(device), layer_seed(self.cfg, self.index))
        h = self.cfg.hidden
        return {"lm_head.weight": draw_full((self.cfg.vocab_size, h), INIT_STD, gen, device, dtype),
                "ln_f.weight": torch.ones(h, device=device, dtype=dtype),
                "ln_f.bias": torch.zeros(h, device=device, dtype=dtype)}

    def reset_parameters(self) -> None:
        init_layer(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def dense_gpt(cfg: GPTConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> nn.Sequential:
    """Sequential(Embedding, Block 1..L, Head), modules named "0" .. "L+1", plain PyTorch. On the meta device
    nothing is allocated; `models.materialize` later draws each layer's weights from its own generator."""
    layers: list[nn.Module] = [Embedding(cfg, device=device, dtype=dtype)]
    layers += [Block(cfg, i, device=device, dtype=dtype) for i in range(1, cfg.layers + 1)]
    layers.append(Head(cfg, device=device, dtype=dtype))
    return nn.Sequential(*layers)


def layer_costs(cfg: GPTConfig) -> list[float]:
    """Relative forward cost of each module of the Sequential, in units of one Block (matmul FLOPs per sequence).

    Block: 24 s h^2 (QKV 6, output 2, MLP 16) + 4 s^2 h (scores and weighted sum). Head: 2 s h V (the logits
    GEMM; the loss's softmax passes over [s, V] are memory-bound and small next to it). Embedding: a gather and
    an add, no matmul; weighed at a nominal 2 % of a block. At hidden 2048, seq 2048, vocab 32000 the head costs
    1.1 blocks. Feed these to `hybrid_engine.parallel.pipeline.balance.balanced_partition` to cut stages of about equal cost.
    """
    s, h, v = cfg.seq_len, cfg.hidden, cfg.vocab_size
    block = 24.0 * s * h * h + 4.0 * s * s * h
    head = 2.0 * s * h * v
    return [0.02] + [1.0] * cfg.layers + [head / block]


def half_costs(cfg: GPTConfig) -> tuple[float, float]:
    """The shares of a Block's cost (layer_costs) of its attention half (QKV and output projections, 8 s h^2, and
    the scores and weighted sum) and of its MLP half (16 s h^2), in RESIDUAL_HALVES' order."""
    s, h = cfg.seq_len, cfg.hidden
    attention, mlp = 8.0 * s * h * h + 4.0 * s * s * h, 16.0 * s * h * h
    return attention / (attention + mlp), mlp / (attention + mlp)
