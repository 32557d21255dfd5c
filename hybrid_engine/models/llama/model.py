"""A Llama-family decoder (Touvron et al. 2023) as an nn.Sequential of pipeline-cuttable layers, plain PyTorch
(nn.Linear, RMSNorm, SDPA) that knows nothing of ranks; parallelize.py makes it tensor- and sequence-parallel
from outside:

    Embedding   tokens [b, s] int64  -> hidden [b, s, h]   token embedding (no positions: RoPE)
    Block x L   hidden [b, s, h]     -> hidden [b, s, h]   x + attn(rmsnorm(x)), then + swiglu(rmsnorm(x))
    Head        hidden [b, s, h]     -> logits [b, s, V]   final RMSNorm + LM head

A block reads its heads from its projections' shapes (`view(b, s, -1, head_dim)`), so one whose projections
were split over MP runs its rank's heads unchanged.

Parameters, the same names and full shapes on every grid (checkpoints reshard): "<i>.attn_q.weight" [heads d, h],
"<i>.attn_kv.weight" [2 kv_heads d, h] in (kv head, {k, v}, d) order so that a contiguous slice holds whole heads,
"<i>.attn_out.weight", "<i>.mlp_gate.weight", "<i>.mlp_up.weight", "<i>.mlp_down.weight", "<i>.norm_attn.weight",
"<i>.norm_mlp.weight" (and Qwen2's "<i>.attn_q.bias", "<i>.attn_kv.bias"); "0.word"; "<L+1>.norm.weight",
"<L+1>.lm_head.weight" (with tied embeddings a separate copy of "0.word": both start equal and their gradients
are summed).

Initial weights are drawn per layer from its (seed, layer) generator (models/init.py): N(0, 0.02), the two
residual output projections N(0, 0.02 / sqrt(2 L)), norms 1; a split layer keeps its rank's slice of the full draw.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid_engine.models.decoder import INIT_STD, Dense, TokenLookup, draw_full, maybe_recompute
from hybrid_engine.models.init import _generator, init_layer, stream_seed

from .config import LlamaConfig, apply_rope, rope_tables

__all__ = ["RMSNorm", "Rotary", "SwiGLU", "Embedding", "Block", "Head", "dense_llama", "layer_costs", "check_split"]

SEED_STREAMS = (5,)  # the stream the registry (models/registry.py) gives it, after the GPT's


def layer_seed(cfg: LlamaConfig, index: int) -> int:
    return stream_seed(cfg.seed, SEED_STREAMS[0], index)


def check_split(cfg: LlamaConfig, mp_size: int) -> None:
    """Raise ValueError (one line) if `cfg` cannot be split over `mp_size` ranks."""
    if cfg.heads % mp_size:
        raise ValueError(f"Llama heads {cfg.heads} is not divisible by the model-parallel size {mp_size}")
    if cfg.kv_heads % mp_size and mp_size % cfg.kv_heads:
        raise ValueError(f"Llama kv-heads {cfg.kv_heads} and the model-parallel size {mp_size}: one must divide the "
                         "other (each rank holds whole key/value groups, or ranks share a replicated one)")
    if cfg.ffn_hidden % mp_size:
        raise ValueError(f"Llama ffn-hidden {cfg.ffn_hidden} is not divisible by the model-parallel size {mp_size}")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension (Zhang and Sennrich 2019) with no initialisation of its own; its weight may
    be handed in (a sequence-parallel norm hands it the view whose gradient is summed over MP)."""

    def __init__(self, dim: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight if weight is None else weight, self.eps)


class Rotary(nn.Module):
    """rope(q, k, cos, sin): q [b, s, heads, d] and k [b, s, kv_heads, d] rotated by the cos and sin rows [s, d] of
    each token's position (any positions: the rows are the caller's); the part a kernels pass swaps for a fused one
    (hybrid_engine/kernels)."""

    def forward(self, q, k, cos, sin):
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


class SwiGLU(nn.Module):
    """swiglu(gate, up) = silu(gate) * up (Shazeer 2020); the part a kernels pass swaps for a fused one."""

    def forward(self, gate, up):
        return F.silu(gate) * up


class _Layer(nn.Module):
    """What the three layers share: their (seed, layer) generator and the draw of their weights at build."""

    def _generator(self, device, index: int | None = None) -> torch.Generator:
        return _generator(torch.device(device), layer_seed(self.cfg, self.index if index is None else index))

    def reset_parameters(self) -> None:
        init_layer(self)


class Embedding(_Layer):
    """tokens [b, s] -> their rows of the token table [b, s, h]. Module 0."""

    index = 0

    def __init__(self, cfg: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden, device=device, dtype=dtype))
        self.lookup = TokenLookup()
        self.reset_parameters()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        return {"word": draw_full((self.cfg.vocab_size, self.cfg.hidden), INIT_STD, self._generator(device),
                                  device, dtype)}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] > self.cfg.context:
            raise ValueError(f"Llama Embedding: tokens must be [batch, seq <= {self.cfg.context}], got "
                             f"{tuple(tokens.shape)}")
        return self.lookup(tokens, self.word)


class Block(_Layer):
    """x + attention(norm_attn(x)), then + down(silu(gate(.)) * up(.)) of norm_mlp(x). Modules 1..L."""

    # Selective recompute (Megatron's --recompute-granularity selective): RoPE and the attention core rerun in
    # backward, every other activation kept. Set per block by whoever builds the stage.
    recompute_attention_core = False
    # Context parallelism (parallel/context): this rank's tokens' global positions and attention over the whole
    # sequence; None: the block holds whole sequences.
    context_parallel = None
    # The residual branches, in forward order, and what each reads: a pipeline may cut between them
    # (parallel/pipeline/units.py)
    RESIDUAL_HALVES = {"attention": ("norm_attn", "attn_q", "attn_kv", "attn_out", "rope", "rope_cos", "rope_sin"),
                       "mlp": ("norm_mlp", "mlp_gate", "mlp_up", "mlp_down", "swiglu")}

    def __init__(self, cfg: LlamaConfig, index: int, *, device=None, dtype=None):
        super().__init__()
        if not 1 <= index <= cfg.layers:
            raise ValueError(f"Llama block index must be in [1, {cfg.layers}], got {index}")
        self.cfg, self.index = cfg, index
        h, d, f = cfg.hidden, cfg.head_dim, cfg.ffn_hidden
        factory = {"device": device, "dtype": dtype}
        self.norm_attn = RMSNorm(h, cfg.norm_eps, **factory)
        self.attn_q = Dense(h, cfg.heads * d, bias=cfg.qkv_bias, **factory)
        self.attn_kv = Dense(h, 2 * cfg.kv_heads * d, bias=cfg.qkv_bias, **factory)
        self.attn_out = Dense(cfg.heads * d, h, bias=False, **factory)
        self.norm_mlp = RMSNorm(h, cfg.norm_eps, **factory)
        self.mlp_gate = Dense(h, f, bias=False, **factory)
        self.mlp_up = Dense(h, f, bias=False, **factory)
        self.mlp_down = Dense(f, h, bias=False, **factory)
        self.rope, self.swiglu = Rotary(), SwiGLU()
        self.register_buffer("rope_cos", torch.empty(cfg.seq_len, d, device=device), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.seq_len, d, device=device), persistent=False)
        self.reset_parameters()

    def reset_buffers(self) -> None:
        cos, sin = rope_tables(self.cfg, self.cfg.seq_len, self.rope_cos.device)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        """Full initial weights, drawn in a fixed order; norms are 1 (and Qwen2's q, k, v biases 0)."""
        c, std = self.cfg, INIT_STD
        out_std = INIT_STD / math.sqrt(2 * c.layers)
        gen = self._generator(device)
        h, qd, kvd = c.hidden, c.heads * c.head_dim, 2 * c.kv_heads * c.head_dim
        full = {"attn_q.weight": draw_full((qd, h), std, gen, device, dtype),
                "attn_kv.weight": draw_full((kvd, h), std, gen, device, dtype),
                "attn_out.weight": draw_full((h, qd), out_std, gen, device, dtype),
                "mlp_gate.weight": draw_full((c.ffn_hidden, h), std, gen, device, dtype),
                "mlp_up.weight": draw_full((c.ffn_hidden, h), std, gen, device, dtype),
                "mlp_down.weight": draw_full((h, c.ffn_hidden), out_std, gen, device, dtype)}
        ones = torch.ones(h, device=device, dtype=dtype)
        if c.qkv_bias:
            full |= {"attn_q.bias": torch.zeros(qd, device=device, dtype=dtype),
                     "attn_kv.bias": torch.zeros(kvd, device=device, dtype=dtype)}
        return full | {"norm_attn.weight": ones, "norm_mlp.weight": ones}

    def attention_core(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q [b, s, heads d], kv [b, s, kv_heads 2 d] (the heads this block holds) -> RoPE, causal SDPA
        -> [b, s, heads d]."""
        b, s, _ = q.shape
        d = self.cfg.head_dim
        q = q.view(b, s, -1, d)
        k, v = kv.view(b, s, -1, 2, d).unbind(3)
        cp = self.context_parallel
        n = s if cp is None else s * cp.size
        cos, sin = ((self.rope_cos[:n], self.rope_sin[:n]) if n <= self.rope_cos.shape[0]
                    else rope_tables(self.cfg, n, q.device))
        if cp is not None:  # this rank's chunks sit at their global positions
            cos, sin = cos[cp.positions(s, q.device)], sin[cp.positions(s, q.device)]
        q, k = self.rope(q, k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
             if cp is None else cp.attention(q, k, v))
        return y.transpose(1, 2).reshape(b, s, -1)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(x)
        y = maybe_recompute(self.recompute_attention_core, self.attention_core, self.attn_q(x), self.attn_kv(x))
        return self.attn_out(y)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm_mlp(x)
        return self.mlp_down(self.swiglu(self.mlp_gate(x), self.mlp_up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)


class Head(_Layer):
    """Final RMSNorm + LM head: logits [b, s, V]. Module L+1."""

    def __init__(self, cfg: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        self.cfg, self.index = cfg, cfg.layers + 1
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device=device, dtype=dtype)
        self.lm_head = Dense(cfg.hidden, cfg.vocab_size, bias=False, device=device, dtype=dtype)
        self.reset_parameters()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        # tied: the embedding's first draw, so both copies start equal
        gen = self._generator(device, 0 if self.cfg.tie_embeddings else None)
        return {"norm.weight": torch.ones(self.cfg.hidden, device=device, dtype=dtype),
                "lm_head.weight": draw_full((self.cfg.vocab_size, self.cfg.hidden), INIT_STD, gen, device, dtype)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


def dense_llama(cfg: LlamaConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> nn.Sequential:
    """Sequential(Embedding, Block 1..L, Head), modules named "0" .. "L+1", plain PyTorch. On the meta device
    nothing is allocated; `models.materialize` later draws each layer's weights from its own generator."""
    kw = {"device": device, "dtype": dtype}
    return nn.Sequential(Embedding(cfg, **kw), *[Block(cfg, i, **kw) for i in range(1, cfg.layers + 1)],
                         Head(cfg, **kw))


def layer_costs(cfg: LlamaConfig) -> list[float]:
    """Relative forward cost of each module, in units of one Block (matmul FLOPs per sequence): a block's
    projections 2 s h (q + 2 kv + out) d-heads plus 6 s h f (SwiGLU), and 4 s^2 heads d for the scores and their
    weighted sum; the head 2 s h V; the embedding a nominal 2 % (a gather). For balance.balanced_partition."""
    s, h, d, v = cfg.seq_len, cfg.hidden, cfg.head_dim, cfg.vocab_size
    block = 2.0 * s * h * d * (2 * cfg.heads + 2 * cfg.kv_heads) + 6.0 * s * h * cfg.ffn_hidden
    block += 4.0 * s * s * cfg.heads * d
    return [0.02] + [1.0] * cfg.layers + [2.0 * s * h * v / block]


def half_costs(cfg: LlamaConfig) -> tuple[float, float]:
    """The shares of a Block's cost (layer_costs) of its attention half (q, kv and output projections, the scores
    and weighted sum) and of its MLP half (SwiGLU's three projections), in RESIDUAL_HALVES' order."""
    s, h, d = cfg.seq_len, cfg.hidden, cfg.head_dim
    attention = 2.0 * s * h * d * (2 * cfg.heads + 2 * cfg.kv_heads) + 4.0 * s * s * cfg.heads * d
    mlp = 6.0 * s * h * cfg.ffn_hidden
    return attention / (attention + mlp), mlp / (attention + mlp)
