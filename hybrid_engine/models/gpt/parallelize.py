"""The GPT made tensor-parallel from outside (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053),
with sequence parallelism after Korthikanti et al. 2022 (https://arxiv.org/abs/2205.05198), by a plan per layer
that parallel/tensor/plan.py applies with the layers the Llama uses too:

    Embedding  vocab-parallel: rank r holds rows [r V'/p, (r+1) V'/p) of the word table (V' = V padded to a
               multiple of mp); a token outside its slice looks up zeros; the partial rows are summed over MP
               (`reduce_from_mp_region`, the paper's g). Positions are replicated.
    Block      QKV column-parallel with whole heads per rank, attention on the rank's heads, output row-parallel;
               MLP fc1 column, fc2 row. One all-reduce forward and one backward per half, each column-parallel
               GEMM entering the MP region inside its C++ autograd function (the input gradient's all-reduce runs
               under the weight gradient's GEMM).
    Head       final LayerNorm (replicated), LM head column-parallel over the padded vocabulary: the logits stay
               split, [b, s, V'/p]; `vocab_parallel_cross_entropy` never gathers them.

Sequence parallel (`sequence_parallel=True`): between layers the activations are [b, s/p, h], this rank's
contiguous chunk of the sequence. LayerNorms, residual adds, biases and dropout-free glue run on the chunk; an
all-gather along the sequence replaces `copy_to` before each column-parallel GEMM and a reduce-scatter replaces
the all-reduce after each row-parallel one (same bytes as the all-reduce, activations p times smaller). The
parameters that then see only a chunk -- LayerNorms, the row-parallel biases, the position table -- have their
gradients summed over MP where they are used (parallel/tensor/sequence_parallel.py). The embedding's output and the
head's input are chunks; the head's logits cover the whole sequence.

Initial weights: each layer draws its full dense initialisation from its (seed, layer) generator (model.py) and
keeps its slice, so they equal the dense model's on every grid. Padding rows of the vocabulary are zero and never
reach the loss (their logits are excluded), so their gradient is zero and they stay zero under any optimizer whose
update of a zero weight with a zero gradient is zero (SGD, Adam(W)). The word and position tables and a tied head
are not weight-decayed; tied, the word table and the head carry `tied`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from hybrid_engine.models.decoder import embedding_tags
from hybrid_engine.parallel.tensor.layers import _rank_and_size
from hybrid_engine.parallel.tensor.plan import (Column, Row, Sequence, SequenceRows, Tags, VocabHead, VocabLookup,
                                                VocabTable, parallelize_module)
from hybrid_engine.parallel.tensor.sequence_parallel import scatter_along_sequence  # noqa: F401  (re-exported)
from hybrid_engine.parallel.tensor.vocab_cross_entropy import vocab_parallel_cross_entropy  # noqa: F401  (re-exported)
from hybrid_engine.parallel.tensor.vocab_parallel import padded_vocab_size  # noqa: F401  (re-exported)

from .model import Block, Embedding, GPTConfig, Head, dense_gpt

__all__ = ["check_gpt_parallel", "boundary_shape", "gpt_plan", "parallelize_gpt", "build_gpt", "padded_vocab_size",
           "vocab_parallel_cross_entropy", "scatter_along_sequence"]


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


def gpt_plan(layer: nn.Module, sequence_parallel: bool) -> dict:
    """The plan of one GPT layer."""
    tied = layer.cfg.tie_embeddings
    if isinstance(layer, Embedding):
        return {"lookup": VocabLookup(), "positions": SequenceRows(), "word": VocabTable(embedding_tags(tied)),
                "position": Tags({"no_weight_decay": True, **({"sequence_parallel": True} if sequence_parallel
                                                              else {})})}
    if isinstance(layer, Head):
        return {"ln_f": Sequence(), "lm_head": VocabHead(embedding_tags(True) if tied else {})}
    return {"ln1": Sequence(), "attn_qkv": Column(), "attn_proj": Row(),
            "ln2": Sequence(), "mlp_fc1": Column(), "mlp_fc2": Row()}


def parallelize_gpt(model: nn.Sequential, mp_group: Optional[dist.ProcessGroup],
                    sequence_parallel: bool = False) -> nn.Sequential:
    """A new Sequential with each GPT layer of `model` (the whole GPT or any contiguous stage of it, dense) made
    parallel over `mp_group`, holding this rank's slices; same module and parameter names. Works on the meta
    device too: the layers are then empty and `models.materialize` draws each one's full weights from its seed
    and slices them. With mp_group None (or of size 1) the layers still compute through the C++ core (deferrable
    weight gradients) and hold the full tensors."""
    mp_size = _rank_and_size(mp_group)[1]
    sp = sequence_parallel and mp_size > 1
    modules: "OrderedDict[str, nn.Module]" = OrderedDict()
    for name, layer in model.named_children():
        check_gpt_parallel(layer.cfg, mp_size)
        modules[name] = parallelize_module(layer, gpt_plan(layer, sp), mp_group, sp, layer.index)
    return nn.Sequential(modules)


def build_gpt(cfg: GPTConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
              mp_group: Optional[dist.ProcessGroup] = None, sequence_parallel: bool = False) -> nn.Sequential:
    """The GPT as the engine computes it: dense_gpt made parallel over `mp_group` (none: one process, the layers
    through the C++ core, tagged)."""
    return parallelize_gpt(dense_gpt(cfg, device, dtype), mp_group, sequence_parallel)
