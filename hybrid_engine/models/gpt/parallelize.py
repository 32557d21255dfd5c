"""Tensor-parallel GPT layers (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053) and the
vocab-parallel cross-entropy; sequence parallelism after Korthikanti et al. 2022 (https://arxiv.org/abs/2205.05198).

    ParallelEmbedding  vocab-parallel: rank r holds rows [r V'/p, (r+1) V'/p) of the word table (V' = V padded to
                       a multiple of mp); a token outside its slice looks up zeros; the partial rows are summed
                       over MP (`reduce_from_mp_region`, the paper's g). Positions are replicated.
    ParallelBlock      QKV column-parallel with whole heads per rank, attention on the rank's heads, output
                       row-parallel; MLP fc1 column, fc2 row. One all-reduce forward and one backward per half.
    ParallelHead       final LayerNorm (replicated), LM head column-parallel over the padded vocabulary: the
                       logits stay split, [b, s, V'/p]; `vocab_parallel_cross_entropy` never gathers them.

Sequence parallel (`sequence_parallel=True`): between layers the activations are [b, s/p, h], this rank's
contiguous chunk of the sequence. LayerNorms, residual adds, biases and dropout-free glue run on the chunk; an
all-gather along the sequence replaces `copy_to` before each column-parallel GEMM and a reduce-scatter replaces
the all-reduce after each row-parallel one (same bytes as the all-reduce, activations p times smaller). The
parameters that then see only a chunk -- LayerNorms, the row-parallel biases, the position table -- get partial
gradients; each is used through `copy_to_mp_region` (identity forward, all-reduce of its gradient backward), so
the gradient every rank holds is the full one and nothing outside these layers changes. (Megatron instead
all-reduces them once per step; those parameters carry `param.sequence_parallel = True` for an engine that wants
to.) The embedding's output and the head's input are chunks; the head's logits cover the whole sequence.

Initial weights: each layer draws its full dense initialisation from its (seed, layer) generator (models/gpt.py)
and keeps its slice, so they equal the dense model's on every grid. Padding rows of the vocabulary are zero and
never reach the loss (their logits are excluded), so their gradient is zero and they stay zero under any
optimizer whose update of a zero weight with a zero gradient is zero (SGD, Adam(W)).

Placement flags (parallel/tensor/layers.py): split tensors carry `mp_split`, `mp_split_dim`; the vocabulary-split ones also
`mp_full_size = V`, so `gather_full` returns the unpadded [V, h] table and `take_shard` pads it back.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybrid_engine.parallel.tensor import ops
from hybrid_engine.models.decoder import exclude_from_weight_decay
from .model import TIED_EMBEDDINGS, Block, Embedding, GPTConfig, Head, LayerNorm, layer_norm, residual_stream
from hybrid_engine.parallel.tensor.sequence_parallel import (_sp_param, gather_along_sequence,
                                reduce_scatter_along_sequence, scatter_along_sequence)
from hybrid_engine.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, _mark, _rank_and_size
from hybrid_engine.parallel.tensor.vocab_parallel import (mark_vocab_split, pad_rows, padded_vocab_size,
                                                          vocab_parallel_lookup)
from hybrid_engine.parallel.tensor.vocab_cross_entropy import vocab_parallel_cross_entropy  # noqa: F401  (re-exported: __all__)

__all__ = [
    "check_gpt_parallel",
    "boundary_shape",
    "padded_vocab_size",
    "ParallelEmbedding",
    "ParallelBlock",
    "ParallelHead",
    "parallelize_gpt",
    "vocab_parallel_cross_entropy",
    "gather_along_sequence",
    "scatter_along_sequence",
    "reduce_scatter_along_sequence",
]


def check_gpt_parallel(cfg: GPTConfig, mp_size: int, sequence_parallel: bool = False) -> None:
    """Raise ValueError (one line) if `cfg` cannot be split over `mp_size` ranks; call before any collective."""
    if mp_size < 1:
        raise ValueError(f"model-parallel size must be >= 1, got {mp_size}")
    if cfg.heads % mp_size:
        raise ValueError(f"GPT heads {cfg.heads} is not divisible by the model-parallel size {mp_size}")
    if sequence_parallel and cfg.seq_len % mp_size:
        raise ValueError(f"--sequence-parallel: seq-len {cfg.seq_len} is not divisible by the model-parallel size "
                         f"{mp_size}")


def boundary_shape(cfg: GPTConfig, rows: int, mp_size: int, sequence_parallel: bool = False) -> tuple[int, int, int]:
    """Shape of the hidden state a pipeline stage sends to the next: [rows, seq_len, hidden], or this rank's
    sequence chunk [rows, seq_len / mp, hidden] under sequence parallelism. (The first stage's input is the
    int64 tokens [rows, seq_len]; the last stage's output, the logits, is consumed by the loss in place.)"""
    seq = cfg.seq_len // mp_size if sequence_parallel and mp_size > 1 else cfg.seq_len
    return (rows, seq, cfg.hidden)


def _mark_replicated(module: nn.Module) -> None:
    for p in module.parameters():
        _mark(p, False)


# ------------------------------------------------------------------------------------------------ layers


class ParallelEmbedding(nn.Module):
    """Vocab-parallel token embedding + replicated positions: tokens [b, s] -> [b, s, h] ([b, s/p, h] under SP)."""

    fp32_residual = Embedding.fp32_residual  # the residual stream in fp32 under half weights (models/gpt.py)

    def __init__(self, cfg: GPTConfig, mp_group: Optional[dist.ProcessGroup], sequence_parallel: bool = False, *,
                 device=None, dtype=None, init: bool = True):
        super().__init__()
        self.cfg, self.index = cfg, Embedding.index
        self.mp_group = mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        self.sequence_parallel = sequence_parallel and self.mp_size > 1
        self.vocab_padded = padded_vocab_size(cfg.vocab_size, self.mp_size)
        self.rows = self.vocab_padded // self.mp_size
        self.vocab_start = self.mp_rank * self.rows
        factory = {"device": device, "dtype": dtype}
        self.word = nn.Parameter(torch.empty(self.rows, cfg.hidden, **factory))
        self.position = nn.Parameter(torch.empty(cfg.seq_len, cfg.hidden, **factory))
        self._place()
        if init:
            self.reset_parameters()

    def _place(self) -> None:
        """Placement flags. Re-applied on reset: `to_empty` (materialize) makes new Parameters without them."""
        mark_vocab_split(self.word, self.mp_size, self.cfg.vocab_size)
        _mark(self.position, False)
        if self.sequence_parallel:
            self.position.sequence_parallel = True
        if self.cfg.tie_embeddings:
            self.word.tied = TIED_EMBEDDINGS
        exclude_from_weight_decay(self.word)
        exclude_from_weight_decay(self.position)

    def reset_parameters(self) -> None:
        self._place()
        if self.word.device.type == "meta":
            return
        self.load_full(Embedding.full_weights(self, self.word.device, self.word.dtype))  # the dense layer's draw

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        word = pad_rows(full["word"], self.vocab_padded)
        self.word.copy_(word[self.vocab_start : self.vocab_start + self.rows])
        self.position.copy_(full["position"])

    @classmethod
    def from_dense(cls, layer: Embedding, mp_group, sequence_parallel: bool = False) -> "ParallelEmbedding":
        out = cls(layer.cfg, mp_group, sequence_parallel, device=layer.word.device, dtype=layer.word.dtype,
                  init=False)
        if layer.word.device.type != "meta":
            out.load_full({"word": layer.word, "position": layer.position})
        return out

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        if tokens.dim() != 2 or s > self.cfg.seq_len:
            raise ValueError(f"GPT Embedding: tokens must be [batch, seq <= {self.cfg.seq_len}], got "
                             f"{tuple(tokens.shape)}")
        fp32 = self.fp32_residual
        rows = vocab_parallel_lookup(tokens, self.word, self.vocab_start, self.mp_group, self.mp_size,
                                     self.sequence_parallel)
        if not self.sequence_parallel:
            return residual_stream(rows, fp32) + residual_stream(self.position[:s], fp32)
        chunk = s // self.mp_size
        position = _sp_param(self.position, self.mp_group)[self.mp_rank * chunk : (self.mp_rank + 1) * chunk]
        return residual_stream(rows, fp32) + residual_stream(position, fp32)

    def extra_repr(self) -> str:
        return (f"vocab={self.cfg.vocab_size} (padded {self.vocab_padded}; rows [{self.vocab_start}, "
                f"{self.vocab_start + self.rows}) on rank {self.mp_rank} of {self.mp_size}), hidden={self.cfg.hidden}, "
                f"sequence_parallel={self.sequence_parallel}")


class ParallelBlock(Block):
    """A GPT block over MP: heads split whole (heads % mp == 0), MLP split along its 4h features."""

    def __init__(self, cfg: GPTConfig, index: int, mp_group: Optional[dist.ProcessGroup],
                 sequence_parallel: bool = False, *, device=None, dtype=None, init: bool = True):
        nn.Module.__init__(self)
        self.cfg, self.index = cfg, index
        self.mp_group = mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        if cfg.heads % self.mp_size:
            raise ValueError(f"GPT heads {cfg.heads} is not divisible by the model-parallel size {self.mp_size}")
        self.sequence_parallel = sequence_parallel and self.mp_size > 1
        self.heads_local = cfg.heads // self.mp_size
        h = cfg.hidden
        factory = {"device": device, "dtype": dtype}
        self.ln1 = LayerNorm(h, **factory)
        self.attn_qkv = ColumnParallelLinear(h, 3 * h, mp_group, bias=False, **factory, init=False)
        self.attn_proj = RowParallelLinear(h, h, mp_group, **factory, init=False)
        self.ln2 = LayerNorm(h, **factory)
        self.mlp_fc1 = ColumnParallelLinear(h, 4 * h, mp_group, **factory, init=False)
        self.mlp_fc2 = RowParallelLinear(4 * h, h, mp_group, **factory, init=False)
        for layer in (self.attn_qkv, self.attn_proj, self.mlp_fc1, self.mlp_fc2):
            layer.trace_layer = index  # its MP collectives are drawn as the block's
        self._place()
        if init:
            self.reset_parameters()

    def _place(self) -> None:
        """Placement flags. Re-applied on reset: `to_empty` (materialize) makes new Parameters without them."""
        for ln in (self.ln1, self.ln2):
            _mark_replicated(ln)
        split = self.mp_size > 1
        for layer, dim in ((self.attn_qkv, 0), (self.mlp_fc1, 0), (self.attn_proj, 1), (self.mlp_fc2, 1)):
            _mark(layer.weight, split, dim)
            _mark(layer.bias, split and dim == 0)
        if self.sequence_parallel:
            for p in (*self.ln1.parameters(), *self.ln2.parameters(), self.attn_proj.bias, self.mlp_fc2.bias):
                p.sequence_parallel = True

    def reset_parameters(self) -> None:
        self._place()
        super().reset_parameters()

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """Keep this rank's slices of the full weights (biases 0, LayerNorms identity)."""
        for name in ("attn_qkv", "mlp_fc1"):
            layer = getattr(self, name)
            layer.weight.copy_(full[f"{name}.weight"].chunk(self.mp_size, dim=0)[self.mp_rank])
            if layer.bias is not None:
                layer.bias.zero_()
        for name in ("attn_proj", "mlp_fc2"):
            layer = getattr(self, name)
            layer.weight.copy_(full[f"{name}.weight"].chunk(self.mp_size, dim=1)[self.mp_rank])
            layer.bias.zero_()
        self.ln1.reset_to_identity()
        self.ln2.reset_to_identity()

    @classmethod
    def from_dense(cls, block: Block, mp_group, sequence_parallel: bool = False) -> "ParallelBlock":
        """This rank's slices of `block`'s current weights (any weights, not only the initial ones)."""
        weight = block.ln1.weight
        out = cls(block.cfg, block.index, mp_group, sequence_parallel, device=weight.device, dtype=weight.dtype,
                  init=False)
        if weight.device.type == "meta":
            return out
        with torch.no_grad():
            for name, dense in (("attn_qkv", block.attn_qkv), ("mlp_fc1", block.mlp_fc1),
                                ("attn_proj", block.attn_proj), ("mlp_fc2", block.mlp_fc2)):
                getattr(out, name)._load_dense(dense)
            for name in ("ln1", "ln2"):
                getattr(out, name).weight.copy_(getattr(block, name).weight)
                getattr(out, name).bias.copy_(getattr(block, name).bias)
        return out

    def _sp_layer_norm(self, x: torch.Tensor, ln: LayerNorm) -> torch.Tensor:
        return layer_norm(x, _sp_param(ln.weight, self.mp_group), _sp_param(ln.bias, self.mp_group))

    def _sp_column(self, x: torch.Tensor, layer: ColumnParallelLinear) -> torch.Tensor:
        return ops.column_parallel_linear(x, layer.weight, layer.bias, layer.grad_buffer, self.mp_group, True,
                                         layer.comm_trace, layer.trace_layer)

    def _sp_row(self, x: torch.Tensor, layer: RowParallelLinear) -> torch.Tensor:
        summed = ops.row_parallel_linear(x, layer.weight, layer.grad_buffer, self.mp_group, True, layer.comm_trace,
                                        layer.trace_layer)
        return summed + _sp_param(layer.bias, self.mp_group)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            return super().attention(x)
        qkv = self._sp_column(self._sp_layer_norm(x, self.ln1), self.attn_qkv)
        return self._sp_row(self.attention_core(qkv), self.attn_proj)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            return super().mlp(x)
        hidden = F.gelu(self._sp_column(self._sp_layer_norm(x, self.ln2), self.mlp_fc1))
        return self._sp_row(hidden, self.mlp_fc2)

    def extra_repr(self) -> str:
        return (f"heads={self.heads_local} of {self.cfg.heads} on rank {self.mp_rank} of {self.mp_size}, "
                f"sequence_parallel={self.sequence_parallel}")


class ParallelHead(Head):
    """Final LayerNorm + column-parallel LM head over the padded vocabulary: logits [b, s, V'/p], never gathered."""

    def __init__(self, cfg: GPTConfig, mp_group: Optional[dist.ProcessGroup], sequence_parallel: bool = False, *,
                 device=None, dtype=None, init: bool = True):
        nn.Module.__init__(self)
        self.cfg, self.index = cfg, cfg.layers + 1
        self.mp_group = mp_group
        self.mp_rank, self.mp_size = _rank_and_size(mp_group)
        self.sequence_parallel = sequence_parallel and self.mp_size > 1
        self.vocab_padded = padded_vocab_size(cfg.vocab_size, self.mp_size)
        factory = {"device": device, "dtype": dtype}
        self.ln_f = LayerNorm(cfg.hidden, **factory)
        self.lm_head = ColumnParallelLinear(cfg.hidden, self.vocab_padded, mp_group, bias=False, **factory,
                                            init=False)
        self.lm_head.trace_layer = self.index
        self._place()
        if init:
            self.reset_parameters()

    def _place(self) -> None:
        """Placement flags. Re-applied on reset: `to_empty` (materialize) makes new Parameters without them."""
        _mark_replicated(self.ln_f)
        if self.sequence_parallel:
            for p in self.ln_f.parameters():
                p.sequence_parallel = True
        mark_vocab_split(self.lm_head.weight, self.mp_size, self.cfg.vocab_size)
        if self.cfg.tie_embeddings:
            self.lm_head.weight.tied = TIED_EMBEDDINGS
            exclude_from_weight_decay(self.lm_head.weight)

    def reset_parameters(self) -> None:
        self._place()
        super().reset_parameters()

    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        weight = pad_rows(full["lm_head.weight"], self.vocab_padded)
        self.lm_head.weight.copy_(weight.chunk(self.mp_size, dim=0)[self.mp_rank])
        self.ln_f.reset_to_identity()

    @classmethod
    def from_dense(cls, head: Head, mp_group, sequence_parallel: bool = False) -> "ParallelHead":
        weight = head.ln_f.weight
        out = cls(head.cfg, mp_group, sequence_parallel, device=weight.device, dtype=weight.dtype, init=False)
        if weight.device.type == "meta":
            return out
        with torch.no_grad():
            out.load_full({"lm_head.weight": head.lm_head.weight})
            out.ln_f.weight.copy_(head.ln_f.weight)
            out.ln_f.bias.copy_(head.ln_f.bias)
        return out

    @property
    def vocab_start(self) -> int:
        return self.mp_rank * (self.vocab_padded // self.mp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sequence_parallel:
            return super().forward(x)
        ln = self.ln_f
        x = layer_norm(x, _sp_param(ln.weight, self.mp_group), _sp_param(ln.bias, self.mp_group))
        head = self.lm_head
        return ops.column_parallel_linear(x, head.weight, None, head.grad_buffer, self.mp_group, True, head.comm_trace,
                                         self.index)

    def extra_repr(self) -> str:
        return (f"vocab={self.cfg.vocab_size} (padded {self.vocab_padded}, {self.vocab_padded // self.mp_size} "
                f"on rank {self.mp_rank} of {self.mp_size}), sequence_parallel={self.sequence_parallel}")


def parallelize_gpt(model: nn.Sequential, mp_group: Optional[dist.ProcessGroup],
                    sequence_parallel: bool = False) -> nn.Sequential:
    """A new Sequential with each GPT layer of `model` (the whole GPT or any contiguous stage of it) replaced by
    its tensor-parallel twin holding this rank's slices; same module names. Works on the meta device too: the
    twins are then empty and `models.materialize` draws each one's full layer from its seed and slices it.
    With mp_group None (or of size 1) the layers still compute through `ops.linear` (deferrable weight
    gradients) and hold the full tensors. Other modules are deep-copied and marked replicated."""
    modules: "OrderedDict[str, nn.Module]" = OrderedDict()
    for name, layer in model.named_children():
        if isinstance(layer, Embedding):
            layer = ParallelEmbedding.from_dense(layer, mp_group, sequence_parallel)
        elif isinstance(layer, Block):
            layer = ParallelBlock.from_dense(layer, mp_group, sequence_parallel)
        elif isinstance(layer, Head):
            layer = ParallelHead.from_dense(layer, mp_group, sequence_parallel)
        else:
            layer = copy.deepcopy(layer)
            _mark_replicated(layer)
        modules[name] = layer
    return nn.Sequential(modules)
