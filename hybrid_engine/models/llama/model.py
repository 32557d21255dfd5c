"""A Llama-family decoder (Touvron et al. 2023) as an nn.Sequential of pipeline-cuttable layers, each one class
that runs dense (no MP group) or tensor-parallel (Megatron-LM, Shoeybi et al. 2019) alike:

    Embedding   tokens [b, s] int64  -> hidden [b, s, h]   vocab-parallel token embedding (no positions: RoPE)
    Block x L   hidden [b, s, h]     -> hidden [b, s, h]   x + attn(rmsnorm(x)), then + swiglu(rmsnorm(x))
    Head        hidden [b, s, h]     -> logits [b, s, V'/p] final RMSNorm + LM head split along the vocabulary

Tensor parallelism. Query heads are split whole over MP (heads % mp == 0); key/value heads too when kv_heads % mp
== 0, else (mp a multiple of kv_heads) every rank holds all of them and uses the one its query heads share, its
gradient summed over MP (kv heads replicated, as vLLM and Megatron's GQA conversions do). The MLP's gate and up
projections are split along the ffn features, the down projection along its input; the output projections are
row-parallel. Each half of a block enters the MP region once (Megatron's f, or under sequence parallelism an
all-gather along the sequence) and its projections then run as local GEMMs through the C++ core (deferrable weight
gradients for zero-bubble schedules, fp32 main grads for half weights); the row-parallel output sums over MP
(all-reduce, or reduce-scatter under sequence parallelism, Korthikanti et al. 2022). RMSNorm weights are
replicated; under sequence parallelism they see a sequence chunk and their gradients are summed over MP.

Parameters, the same names and full shapes on every grid (checkpoints reshard): "<i>.attn_q.weight" [heads d, h],
"<i>.attn_kv.weight" [2 kv_heads d, h] in (kv head, {k, v}, d) order so that a contiguous slice holds whole heads,
"<i>.attn_out.weight", "<i>.mlp_gate.weight", "<i>.mlp_up.weight", "<i>.mlp_down.weight", "<i>.norm_attn.weight",
"<i>.norm_mlp.weight"; "0.word"; "<L+1>.norm.weight", "<L+1>.lm_head.weight" (tagged tied to "0.word" when the
embeddings are tied; both copies then start equal and their gradients are summed).

Initial weights are drawn per layer from its (seed, layer) generator (models/decoder.py): N(0, 0.02), the two
residual output projections N(0, 0.02 / sqrt(2 L)), norms 1; each rank keeps its slice of the full draw.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from hybrid_engine.parallel.tensor import ops
from hybrid_engine.models.decoder import (INIT_STD, TIED_EMBEDDINGS, draw_full, exclude_from_weight_decay,
                                          maybe_recompute)
from hybrid_engine.models.mlp.model import _generator, stream_seed
from hybrid_engine.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, _mark, _rank_and_size
from hybrid_engine.parallel.tensor.sequence_parallel import _sp_param, gather_along_sequence
from hybrid_engine.parallel.tensor.vocab_parallel import (mark_vocab_split, pad_rows, padded_vocab_size,
                                                          vocab_parallel_lookup)

from .config import LlamaConfig, apply_rope, rope_tables

__all__ = ["RMSNorm", "Embedding", "Block", "Head", "build_llama", "layer_costs", "check_split"]

_STREAM_LLAMA = 5  # after the MLP's streams (1-3) and the GPT's (4)


def layer_seed(cfg: LlamaConfig, index: int) -> int:
    return stream_seed(cfg.seed, _STREAM_LLAMA, index)


def check_split(cfg: LlamaConfig, mp_size: int) -> None:
    """Raise ValueError (one line) if `cfg` cannot be split over `mp_size` ranks."""
    if cfg.heads % mp_size:
        raise ValueError(f"Llama heads {cfg.heads} is not divisible by the model-parallel size {mp_size}")
    if cfg.kv_heads % mp_size and mp_size % cfg.kv_heads:
        raise ValueError(f"Llama kv-heads {cfg.kv_heads} and the model-parallel size {mp_size}: one must divide the "
                         "other (kv heads split whole, or replicated on the ranks that share one)")
    if cfg.ffn_hidden % mp_size:
        raise ValueError(f"Llama ffn-hidden {cfg.ffn_hidden} is not divisible by the model-parallel size {mp_size}")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension (Zhang and Sennrich 2019) with no initialisation of its own."""

    def __init__(self, dim: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight if weight is None else weight, self.eps)


class _Layer(nn.Module):
    """What the three layers share: their place in the MP group, the full-weights protocol (`full_weights` draws
    the initial full tensors, `load_full` keeps this rank's slices of any full tensors), and `from_dense`."""

    def _setup(self, cfg: LlamaConfig, index: int, mp_group, sequence_parallel: bool) -> None:
        self.cfg, self.index, self.mp_group = cfg, index, mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        self.sequence_parallel = sequence_parallel and self.mp_size > 1

    def _generator(self, device, index: Optional[int] = None) -> torch.Generator:
        return _generator(torch.device(device), layer_seed(self.cfg, self.index if index is None else index))

    def _sp(self, param: torch.Tensor) -> torch.Tensor:
        """A replicated parameter used on a sequence chunk: its gradient summed over MP under SP."""
        return _sp_param(param, self.mp_group) if self.sequence_parallel else param

    def reset_parameters(self) -> None:
        self._place()
        first = next(self.parameters())
        if first.device.type != "meta":
            self.load_full(self.full_weights(first.device, first.dtype))

    def dense_weights(self) -> dict[str, torch.Tensor]:
        """This layer's full tensors (of a dense layer: no MP group)."""
        return {name: p.detach() for name, p in self.named_parameters()}

    def _shape_args(self) -> tuple:
        return (self.cfg,)

    @classmethod
    def from_dense(cls, layer: "_Layer", mp_group, sequence_parallel: bool = False) -> "_Layer":
        """This rank's slices of a dense layer's current weights (on the meta device: an empty twin)."""
        first = next(layer.parameters())
        out = cls(*layer._shape_args(), mp_group=mp_group, sequence_parallel=sequence_parallel,
                  device=first.device, dtype=first.dtype, init=False)
        if first.device.type != "meta":
            out.load_full(layer.dense_weights())
        return out


class Embedding(_Layer):
    """tokens [b, s] -> their rows of the token table [b, s, h] ([b, s/p, h] under SP). Module 0."""

    def __init__(self, cfg: LlamaConfig, mp_group: Optional[dist.ProcessGroup] = None, sequence_parallel=False, *,
                 device=None, dtype=None, init: bool = True):
        super().__init__()
        self._setup(cfg, 0, mp_group, sequence_parallel)
        self.vocab_padded = padded_vocab_size(cfg.vocab_size, self.mp_size)
        self.rows = self.vocab_padded // self.mp_size
        self.vocab_start = self.mp_rank * self.rows
        self.word = nn.Parameter(torch.empty(self.rows, cfg.hidden, device=device, dtype=dtype))
        self._place()
        if init:
            self.reset_parameters()

    def _place(self) -> None:
        """Placement and tags, re-applied on reset: `to_empty` (materialize) makes new Parameters without them."""
        mark_vocab_split(self.word, self.mp_size, self.cfg.vocab_size)
        exclude_from_weight_decay(self.word)
        if self.cfg.tie_embeddings:
            self.word.tied = TIED_EMBEDDINGS

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        return {"word": draw_full((self.cfg.vocab_size, self.cfg.hidden), INIT_STD, self._generator(device),
                                  device, dtype)}

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        self.word.copy_(pad_rows(full["word"], self.vocab_padded)[self.vocab_start : self.vocab_start + self.rows])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[1] > self.cfg.context:
            raise ValueError(f"Llama Embedding: tokens must be [batch, seq <= {self.cfg.context}], got "
                             f"{tuple(tokens.shape)}")
        return vocab_parallel_lookup(tokens, self.word, self.vocab_start, self.mp_group, self.mp_size,
                                     self.sequence_parallel)


class Block(_Layer):
    """x + attention(norm_attn(x)), then + down(silu(gate(.)) * up(.)) of norm_mlp(x). Modules 1..L."""

    # Selective recompute (Megatron's --recompute-granularity selective): RoPE and the attention core rerun in
    # backward, every other activation kept. Set per block by whoever builds the stage.
    recompute_attention_core = False

    def __init__(self, cfg: LlamaConfig, index: int, mp_group: Optional[dist.ProcessGroup] = None,
                 sequence_parallel: bool = False, *, device=None, dtype=None, init: bool = True):
        super().__init__()
        if not 1 <= index <= cfg.layers:
            raise ValueError(f"Llama block index must be in [1, {cfg.layers}], got {index}")
        self._setup(cfg, index, mp_group, sequence_parallel)
        check_split(cfg, self.mp_size)
        h, d, f = cfg.hidden, cfg.head_dim, cfg.ffn_hidden
        self.heads_local = cfg.heads // self.mp_size
        self.kv_split = cfg.kv_heads % self.mp_size == 0
        self.kv_local = cfg.kv_heads // self.mp_size if self.kv_split else 1
        self.kv_head = self.mp_rank * cfg.kv_heads // self.mp_size  # the one this rank uses when replicated
        factory = {"device": device, "dtype": dtype, "bias": False, "init": False}
        qkv = factory | {"bias": cfg.qkv_bias}
        self.norm_attn = RMSNorm(h, cfg.norm_eps, device=device, dtype=dtype)
        self.attn_q = ColumnParallelLinear(h, cfg.heads * d, mp_group, **qkv)
        self.attn_kv = ColumnParallelLinear(h, 2 * cfg.kv_heads * d, mp_group if self.kv_split else None, **qkv)
        self.attn_out = RowParallelLinear(cfg.heads * d, h, mp_group, **factory)
        self.norm_mlp = RMSNorm(h, cfg.norm_eps, device=device, dtype=dtype)
        self.mlp_gate = ColumnParallelLinear(h, f, mp_group, **factory)
        self.mlp_up = ColumnParallelLinear(h, f, mp_group, **factory)
        self.mlp_down = RowParallelLinear(f, h, mp_group, **factory)
        for layer in (self.attn_out, self.mlp_down):
            layer.trace_layer = index  # its MP collectives are drawn as the block's
        self.register_buffer("rope_cos", torch.empty(cfg.seq_len, d, device=device), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.seq_len, d, device=device), persistent=False)
        self._place()
        if init:
            self.reset_parameters()
        elif self.rope_cos.device.type != "meta":
            self._set_rope()

    def _shape_args(self) -> tuple:
        return (self.cfg, self.index)

    def _place(self) -> None:
        """Placement flags, re-applied on reset: `to_empty` (materialize) makes new Parameters without them."""
        split = self.mp_size > 1
        for layer, dim in ((self.attn_q, 0), (self.mlp_gate, 0), (self.mlp_up, 0), (self.attn_out, 1),
                           (self.mlp_down, 1)):
            _mark(layer.weight, split, dim)
        _mark(self.attn_q.bias, split)
        _mark(self.attn_kv.weight, split and self.kv_split)
        _mark(self.attn_kv.bias, split and self.kv_split)
        for norm in (self.norm_attn, self.norm_mlp):
            _mark(norm.weight, False)
            if self.sequence_parallel:
                norm.weight.sequence_parallel = True

    def _set_rope(self) -> None:
        cos, sin = rope_tables(self.cfg, self.cfg.seq_len, self.rope_cos.device)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.rope_cos.device.type != "meta":
            self._set_rope()

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        """Full initial weights, drawn in a fixed order; norms are 1."""
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

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """Keep this rank's slices of full weights."""
        for name, dim in (("attn_q", 0), ("mlp_gate", 0), ("mlp_up", 0), ("attn_out", 1), ("mlp_down", 1),
                          ("attn_kv", 0 if self.kv_split else None)):
            for kind in ("weight", "bias"):
                mine, whole = getattr(getattr(self, name), kind), full.get(f"{name}.{kind}")
                if mine is not None:
                    mine.copy_(whole if dim is None else whole.chunk(self.mp_size, dim)[self.mp_rank])
        self.norm_attn.weight.copy_(full["norm_attn.weight"])
        self.norm_mlp.weight.copy_(full["norm_mlp.weight"])

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        """Into the MP region, once for every GEMM that reads x: identity forward, the input gradient summed over
        MP backward (Megatron's f); under SP the sequence all-gathered (backward: reduce-scatter)."""
        if self.sequence_parallel:
            return gather_along_sequence(x, self.mp_group)
        return ops.copy_to_mp_region(x, self.mp_group)

    def _row(self, x: torch.Tensor, layer: RowParallelLinear) -> torch.Tensor:
        return ops.row_parallel_linear(x, layer.weight, layer.grad_buffer, self.mp_group, self.sequence_parallel,
                                      layer.comm_trace, layer.trace_layer)

    def _kv(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.attn_kv
        if self.kv_split:
            return ops.linear(x, kv.weight, kv.bias, kv.grad_buffer)
        # replicated: this rank's kv head only; every rank's partial gradient of the whole weight summed over MP
        rows = slice(self.kv_head * 2 * self.cfg.head_dim, (self.kv_head + 1) * 2 * self.cfg.head_dim)
        weight, bias = (None if t is None else ops.copy_to_mp_region(t, self.mp_group)[rows]
                        for t in (kv.weight, kv.bias))
        return F.linear(x, weight, bias)

    def attention_core(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q [b, s, heads d], kv [b, s, kv_heads 2 d] (this rank's) -> RoPE, causal SDPA -> [b, s, heads d]."""
        b, s, _ = q.shape
        d = self.cfg.head_dim
        q = q.view(b, s, self.heads_local, d)
        k, v = kv.view(b, s, self.kv_local, 2, d).unbind(3)
        cos, sin = ((self.rope_cos[:s], self.rope_sin[:s]) if s <= self.rope_cos.shape[0]
                    else rope_tables(self.cfg, s, q.device))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=self.heads_local != self.kv_local)
        return y.transpose(1, 2).reshape(b, s, self.heads_local * d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        x = self._enter(self.norm_attn(x, self._sp(self.norm_attn.weight)))
        q = ops.linear(x, self.attn_q.weight, self.attn_q.bias, self.attn_q.grad_buffer)
        y = maybe_recompute(self.recompute_attention_core, self.attention_core, q, self._kv(x))
        return self._row(y, self.attn_out)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        x = self._enter(self.norm_mlp(x, self._sp(self.norm_mlp.weight)))
        gate = ops.linear(x, self.mlp_gate.weight, None, self.mlp_gate.grad_buffer)
        up = ops.linear(x, self.mlp_up.weight, None, self.mlp_up.grad_buffer)
        return self._row(F.silu(gate) * up, self.mlp_down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)

    def extra_repr(self) -> str:
        kv = f"{self.kv_local} kv" if self.kv_split else f"kv head {self.kv_head} (replicated)"
        return (f"heads={self.heads_local} of {self.cfg.heads}, {kv}, on rank {self.mp_rank} of {self.mp_size}, "
                f"sequence_parallel={self.sequence_parallel}")


class Head(_Layer):
    """Final RMSNorm + LM head split along the padded vocabulary: logits [b, s, V'/p], never gathered. Module L+1."""

    def __init__(self, cfg: LlamaConfig, mp_group: Optional[dist.ProcessGroup] = None, sequence_parallel=False, *,
                 device=None, dtype=None, init: bool = True):
        super().__init__()
        self._setup(cfg, cfg.layers + 1, mp_group, sequence_parallel)
        self.vocab_padded = padded_vocab_size(cfg.vocab_size, self.mp_size)
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device=device, dtype=dtype)
        self.lm_head = ColumnParallelLinear(cfg.hidden, self.vocab_padded, mp_group, bias=False, device=device,
                                            dtype=dtype, init=False)
        self.lm_head.trace_layer = self.index
        self._place()
        if init:
            self.reset_parameters()

    def _place(self) -> None:
        _mark(self.norm.weight, False)
        if self.sequence_parallel:
            self.norm.weight.sequence_parallel = True
        mark_vocab_split(self.lm_head.weight, self.mp_size, self.cfg.vocab_size)
        if self.cfg.tie_embeddings:
            self.lm_head.weight.tied = TIED_EMBEDDINGS
            exclude_from_weight_decay(self.lm_head.weight)  # it is the embedding

    def full_weights(self, device, dtype) -> dict[str, torch.Tensor]:
        # tied: the embedding's first draw, so both copies start equal
        gen = self._generator(device, 0 if self.cfg.tie_embeddings else None)
        return {"lm_head.weight": draw_full((self.cfg.vocab_size, self.cfg.hidden), INIT_STD, gen, device, dtype),
                "norm.weight": torch.ones(self.cfg.hidden, device=device, dtype=dtype)}

    def dense_weights(self) -> dict[str, torch.Tensor]:
        return {"lm_head.weight": self.lm_head.weight.detach()[: self.cfg.vocab_size],
                "norm.weight": self.norm.weight.detach()}

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        weight = pad_rows(full["lm_head.weight"], self.vocab_padded)
        self.lm_head.weight.copy_(weight.chunk(self.mp_size, dim=0)[self.mp_rank])
        self.norm.weight.copy_(full["norm.weight"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x, self._sp(self.norm.weight))
        head = self.lm_head
        return ops.column_parallel_linear(x, head.weight, None, head.grad_buffer, self.mp_group,
                                         self.sequence_parallel, head.comm_trace, self.index)


def build_llama(cfg: LlamaConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                mp_group: Optional[dist.ProcessGroup] = None, sequence_parallel: bool = False) -> nn.Sequential:
    """Sequential(Embedding, Block 1..L, Head), modules named "0" .. "L+1": dense without an MP group. On the meta
    device nothing is allocated; `models.materialize` later draws each layer's weights from its own generator."""
    kw = {"mp_group": mp_group, "sequence_parallel": sequence_parallel, "device": device, "dtype": dtype}
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
