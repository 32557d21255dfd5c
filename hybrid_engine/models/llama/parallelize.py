"""The Llama's tensor-parallel function (torchtitan's parallelize_llama): every layer of a stage rebuilt over the
MP group, keeping this rank's slices (models/llama/model.py says how each is split), with sequence parallelism
and selective recomputation switched on where asked."""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist
from torch import nn

from hybrid_engine.parallel.tensor.layers import _mark

from .model import Block, Embedding, Head


def parallelize_llama(model: nn.Sequential, mp_group: Optional[dist.ProcessGroup],
                      sequence_parallel: bool = False, selective_recompute: bool = False) -> nn.Sequential:
    """A new Sequential with each Llama layer of `model` (the whole model or any contiguous stage of it, dense)
    replaced by its twin over `mp_group` holding this rank's slices; same module names. On the meta device the
    twins are empty and `models.materialize` draws each one's full layer from its seed and slices it. Other
    modules are deep-copied and marked replicated."""
    modules: "OrderedDict[str, nn.Module]" = OrderedDict()
    for name, layer in model.named_children():
        if isinstance(layer, (Embedding, Block, Head)):
            layer = type(layer).from_dense(layer, mp_group, sequence_parallel)
            if isinstance(layer, Block):
                layer.recompute_attention_core = selective_recompute
        else:
            layer = copy.deepcopy(layer)
            for p in layer.parameters():
                _mark(p, False)
        modules[name] = layer
    return nn.Sequential(modules)


@dataclass(frozen=True)
class ParallelizeLlama:
    """parallelize_llama with the run's options, as the value an Engine takes (`Engine(parallelize=...)`)."""

    sequence_parallel: bool = False
    selective_recompute: bool = False

    def __call__(self, stage: nn.Sequential, mp_group) -> nn.Sequential:
        return parallelize_llama(stage, mp_group, self.sequence_parallel, self.selective_recompute)
