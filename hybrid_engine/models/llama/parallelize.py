"""The Llama made tensor- and sequence-parallel from outside (Megatron-LM, Shoeybi et al. 2019; sequence parallelism
after Korthikanti et al. 2022), by a plan per layer that parallel/tensor/plan.py applies, the way torchtitan's
parallelize_llama reads:

    Embedding  the token table split along the vocabulary padded to a multiple of mp; each rank looks up the
               tokens its rows hold and the rows are summed over MP (under SP reduce-scattered: a sequence chunk).
    Block      each half enters the MP region once, after its RMSNorm (Megatron's f, or under SP an all-gather
               along the sequence), shared by the projections that read it: q and kv, gate and up, each then a
               local GEMM through the C++ core (deferrable weight gradients for zero-bubble schedules, fp32 main
               grads for half weights). Query heads split whole over MP (heads % mp == 0); key/value heads too when
               kv_heads % mp == 0, else (mp a multiple of kv_heads) every rank holds all of them and uses the one
               its query heads share, its gradient summed over MP. Gate and up split along the ffn features; the
               output projections are row-parallel, summed over MP (all-reduce, or reduce-scatter under SP).
               RMSNorm weights are replicated; under SP they see a sequence chunk and their gradients are summed.
    Head       final RMSNorm (replicated, as above), LM head column-parallel over the padded vocabulary: logits
               [b, s, V'/p], never gathered (the vocab-parallel loss takes them).

The word table and a tied head are not weight-decayed; tied, both carry `tied` (their gradients summed across the
first and last stage). Selective recomputation of the attention core is switched on here where asked.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from hybrid_engine.kernels.apply import apply_kernels
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models.decoder import embedding_tags
from hybrid_engine.parallel.tensor.layers import _rank_and_size
from hybrid_engine.parallel.tensor.plan import (Column, ReplicatedHeads, Row, Sequence, VocabHead, VocabLookup,
                                                VocabTable, parallelize_module)

from .config import LlamaConfig
from .model import Block, Embedding, Head, check_split, dense_llama


def llama_plan(layer: nn.Module, mp_size: int) -> dict:
    """The plan of one Llama layer over `mp_size` ranks."""
    cfg: LlamaConfig = layer.cfg
    if isinstance(layer, Embedding):
        return {"lookup": VocabLookup(), "word": VocabTable(embedding_tags(cfg.tie_embeddings))}
    if isinstance(layer, Head):
        return {"norm": Sequence(), "lm_head": VocabHead(embedding_tags(True) if cfg.tie_embeddings else {})}
    kv = Column(in_region=True) if cfg.kv_heads % mp_size == 0 else ReplicatedHeads(cfg.kv_heads)
    return {"norm_attn": Sequence(enter=True), "attn_q": Column(in_region=True), "attn_kv": kv,
            "attn_out": Row(),
            "norm_mlp": Sequence(enter=True), "mlp_gate": Column(in_region=True), "mlp_up": Column(in_region=True),
            "mlp_down": Row()}


def parallelize_llama(model: nn.Sequential, mp_group: Optional[dist.ProcessGroup],
                      sequence_parallel: bool = False, selective_recompute: bool = False) -> nn.Sequential:
    """A new Sequential with each Llama layer of `model` (the whole model or any contiguous stage of it, dense)
    made parallel over `mp_group`, holding this rank's slices; same module and parameter names. With no group
    (or one of one rank) the layers still compute through the C++ core. On the meta device the layers are empty
    and `models.materialize` draws each one's full weights from its seed and slices them."""
    mp_size = _rank_and_size(mp_group)[1]
    modules: "OrderedDict[str, nn.Module]" = OrderedDict()
    for name, layer in model.named_children():
        check_split(layer.cfg, mp_size)
        layer = parallelize_module(layer, llama_plan(layer, mp_size), mp_group, sequence_parallel, layer.index)
        if isinstance(layer, Block):
            layer.recompute_attention_core = selective_recompute
        modules[name] = layer
    return nn.Sequential(modules)


def build_llama(cfg: LlamaConfig, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                mp_group: Optional[dist.ProcessGroup] = None, sequence_parallel: bool = False) -> nn.Sequential:
    """The Llama as the engine computes it: dense_llama made parallel over `mp_group` (none: one process, the
    layers through the C++ core, tagged)."""
    return parallelize_llama(dense_llama(cfg, device, dtype), mp_group, sequence_parallel)


@dataclass(frozen=True)
class ParallelizeLlama:
    """parallelize_llama with the run's options, as the value an Engine takes (`Engine(parallelize=...)`), then
    the kernels pass (fused modules, fp8 GEMMs) the run's KernelOptions ask for."""

    sequence_parallel: bool = False
    selective_recompute: bool = False
    kernels: KernelOptions = KernelOptions()

    def __call__(self, stage: nn.Sequential, mp_group) -> nn.Sequential:
        stage = parallelize_llama(stage, mp_group, self.sequence_parallel, self.selective_recompute)
        return apply_kernels(stage, self.kernels) if self.kernels.any else stage
