"""The kernels pass: a stage made tensor-parallel by its model's plan, its modules swapped for the fused ones and
its linear layers' GEMMs for float8 ones, as the run's KernelOptions say. By type, so one pass serves every model
built from these parts:

    RMSNorm (models/llama)        -> FusedRMSNorm, also inside a sequence-parallel ReplicatedNorm (which keeps
                                     the weight and hands it in)
    Rotary, SwiGLU (models/llama) -> FusedRotary, FusedSwiGLU
    a last stage's Head.lm_head   -> LinearCrossEntropyHead (the logits computed chunk by chunk in the loss:
    (models/llama, models/gpt)       the workload's loss must then be LinearCrossEntropy, `loss_for` says which)
    --fp8: every tensor-parallel linear layer of a Block -> Fp8Linear (not the LM head, as torchao's and
           torchtitan's recipes leave it: the logits' precision matters most and the head is one GEMM of many;
           not a kv projection replicated over MP, which computes through F.linear)

Parameters keep their names, placement and tags; the stage is changed in place and returned."""
from __future__ import annotations

from torch import nn

from hybrid_engine.fp8.linear import to_fp8
from hybrid_engine.models import losses
from hybrid_engine.models.gpt import model as gpt
from hybrid_engine.models.llama import model as llama
from hybrid_engine.models.llama.model import RMSNorm, Rotary, SwiGLU
from hybrid_engine.parallel.tensor.sequence_parallel import ReplicatedNorm

from .elementwise import FusedRMSNorm, FusedRotary, FusedSwiGLU
from .linear_cross_entropy import LinearCrossEntropy, LinearCrossEntropyHead
from .options import KernelOptions

__all__ = ["apply_kernels", "loss_for"]


def _fuse(module: nn.Module, compiled: bool) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, RMSNorm):
            setattr(module, name, FusedRMSNorm(child, compiled))
        elif isinstance(child, Rotary):
            setattr(module, name, FusedRotary(compiled))
        elif isinstance(child, SwiGLU):
            setattr(module, name, FusedSwiGLU(compiled))
        else:
            if isinstance(child, ReplicatedNorm) and isinstance(child.norm, RMSNorm):
                object.__setattr__(child, "norm", FusedRMSNorm(child.norm, compiled))
            _fuse(child, compiled)


def apply_kernels(stage: nn.Sequential, options: KernelOptions) -> nn.Sequential:
    """`stage` (a model's stage after its tensor-parallel plan) with the fused modules and fp8 GEMMs `options`
    asks for."""
    if options.fused:
        if options.elementwise:
            _fuse(stage, options.compiled)
        for layer in stage:
            if isinstance(layer, (llama.Head, gpt.Head)):
                layer.lm_head = LinearCrossEntropyHead(layer.lm_head)
    if options.fp8 is not None:
        for layer in stage:
            if isinstance(layer, (llama.Block, gpt.Block)):
                to_fp8(layer, options.fp8, options.fp8_native, options.compiled, options.fp8_weight_cache)
    return stage


def loss_for(loss: losses.LossSpec, options: KernelOptions) -> losses.LossSpec:
    """The loss a workload computes under `options`: with fused kernels, a vocab-parallel cross-entropy becomes
    the fused linear + cross-entropy of the same vocabulary (the head's logits are the loss's to compute)."""
    if options.fused and isinstance(loss, losses.VocabParallelCrossEntropy):
        return LinearCrossEntropy(loss.vocab_size, compiled=options.compiled)
    return loss
