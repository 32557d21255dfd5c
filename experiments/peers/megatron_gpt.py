"""Megatron-core's GPT as its users run it without TransformerEngine or apex, at any tp x pp (CUDA only).

GPTModel with the local layer spec (Megatron's own ColumnParallel/RowParallelLinear and DotProductAttention),
learned absolute positions, untied head, no QKV bias, no dropout; Float16Module (bf16 weights), its DDP with
fp32 gradient buffers, its bf16 optimizer (fp32 masters; torch's AdamW underneath when apex/TE are absent).
Steps go through its own schedules (get_forward_backward_func: the 1F1B pipeline at pp > 1, gradient
accumulation at pp = 1) with finalize_model_grads, which also all-reduces the sequence-parallel LayerNorm
gradients over TP. As Megatron-LM's training loop sets them: deallocate_pipeline_outputs, no_sync_func, and
(the caller's job) CUDA_DEVICE_MAX_CONNECTIONS=1, on which its TP communication overlap relies.

Two departures from the stock local spec, each forced and said in the record:
- Sequence parallelism: the local spec's LayerNorm without apex (WrappedTorchNorm) refuses it, so under
  --sequence-parallel the norms are torch's LayerNorm with the `sequence_parallel` tag that Megatron's own
  FusedLayerNorm puts on its weights (what finalize_model_grads looks for).
- The pipeline cut: `first_stage_layers` blocks on the first stage (num_layers_in_first_pipeline_stage), so
  that Megatron balances the same stages as the engine and the torch pipeline.

Every megatron import is inside a function: importing this file needs no megatron.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.distributed as dist

import common  # first of ours: it puts the repository on sys.path
from gpt_peer_run import engine_cut
from hybrid_engine.models.gpt.model import GPTConfig


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm built the way Megatron builds a norm, its weights tagged for the SP gradient all-reduce."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        for p in (self.weight, self.bias):
            p.sequence_parallel = config.sequence_parallel


def build_model(cfg: GPTConfig, lr: float, device: torch.device, *, tp: int = 1, pp: int = 1,
                sequence_parallel: bool = False, first_stage_layers: int | None = None,
                clip_grad: float | None = None):
    """(DDP-wrapped model of this rank's stage, its optimizer, the TransformerConfig). clip_grad None keeps
    Megatron's default (1.0); 0 turns clipping off."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
    uneven = {"num_layers_in_first_pipeline_stage": first_stage_layers} if pp > 1 and first_stage_layers else {}
    tcfg = TransformerConfig(num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                             ffn_hidden_size=4 * cfg.hidden, bf16=True, params_dtype=torch.bfloat16,
                             pipeline_dtype=torch.bfloat16, add_qkv_bias=False, hidden_dropout=0.0,
                             attention_dropout=0.0, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             sequence_parallel=sequence_parallel, deallocate_pipeline_outputs=pp > 1, **uneven)
    model = GPTModel(config=tcfg, transformer_layer_spec=layer_spec(tcfg, get_gpt_layer_local_spec()),
                     vocab_size=cfg.vocab_size, max_sequence_length=cfg.seq_len,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     position_embedding_type="learned_absolute", share_embeddings_and_output_weights=False).to(device)
    model = Float16Module(tcfg, model)
    model = DistributedDataParallel(tcfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    tcfg.no_sync_func = model.no_sync
    tcfg.finalize_model_grads_func = finalize_model_grads
    clip = {} if clip_grad is None else {"clip_grad": clip_grad}
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=lr, bf16=True, weight_decay=0.01, **clip),
                                 [model])
    return model, opt, tcfg


def layer_spec(tcfg, local_spec):
    """The local spec as it is, or under sequence parallelism the block with SP-capable norms (module docstring)."""
    if not tcfg.sequence_parallel:
        return local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    norms = {"input_layernorm": SequenceParallelLayerNorm, "pre_mlp_layernorm": SequenceParallelLayerNorm}
    layer = dataclasses.replace(local_spec, submodules=dataclasses.replace(local_spec.submodules, **norms))
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(tcfg),
                                      layer_norm=SequenceParallelLayerNorm)


def build_step(a: argparse.Namespace, cfg: GPTConfig, device: torch.device, *, pp: int, tp: int,
               sequence_parallel: bool, build=None, cut=engine_cut, clip_grad: float = 0.0):
    """(step(inputs, targets) -> loss on every rank, the record's fields) over tp x pp = all ranks. build, cut:
    another model's Megatron builder (build_model's signature) and the engine's cut of it (megatron_llama.py)."""
    build = build or build_model
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if tp * pp != dist.get_world_size():
        common.fail(f"megatron: tp {tp} x pp {pp} must use all {dist.get_world_size()} ranks")
    # pp = 2: the engine's cut; deeper pipelines: Megatron's own even split of the blocks
    first_blocks = sum(1 for i in cut(cfg, pp)[0] if 1 <= i <= cfg.layers) if pp == 2 else None
    model, optimizer, tcfg = build(cfg, a.lr, device, tp=tp, pp=pp, sequence_parallel=sequence_parallel,
                                   first_stage_layers=first_blocks, clip_grad=clip_grad)
    last = parallel_state.is_pipeline_last_stage()
    forward_backward = get_forward_backward_func()
    micro, mbs = a.micro_batches, a.batch_size // a.micro_batches
    position_ids = torch.arange(cfg.seq_len, device=device).unsqueeze(0).expand(mbs, -1)
    attention_mask = torch.ones(1, 1, cfg.seq_len, cfg.seq_len, device=device).tril().logical_not()

    def loss_func(per_token: torch.Tensor):
        loss = per_token.float().mean()
        return loss, {"loss": loss.detach().clone()}  # the schedule divides `loss` in place by the count

    def forward_step(data_iterator, model):
        tokens, targets = next(data_iterator)
        return model(tokens, position_ids, attention_mask, labels=targets), loss_func

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model.zero_grad_buffer()
        optimizer.zero_grad()
        out = forward_backward(forward_step_func=forward_step, data_iterator=iter(zip(x.chunk(micro), y.chunk(micro))),
                               model=[model], num_microbatches=micro, seq_length=cfg.seq_len, micro_batch_size=mbs,
                               forward_only=False)
        optimizer.step()
        loss = torch.stack([o["loss"] for o in out]).mean() if last else torch.zeros((), device=device)
        dist.all_reduce(loss)  # the last stage's tp ranks each hold the loss
        return loss / tp

    axes = "-".join(a for a, n in (("pp", pp), ("tp", tp)) if n > 1)
    fields = {"system": f"megatron-{axes}{'-sp' if sequence_parallel else ''}", "pp": pp, "tp": tp,
              "sequence_parallel": sequence_parallel, "spec": "local (no TransformerEngine, no apex)",
              "optimizer": "Megatron bf16 optimizer over torch AdamW (fp32 masters), no clipping",
              "init": "Megatron's own (so its losses compare with the others only in size)"}
    if first_blocks:
        fields["first_stage_blocks"] = first_blocks
    if sequence_parallel:
        fields["norm"] = "torch LayerNorm tagged sequence_parallel (the local spec's WrappedTorchNorm refuses SP)"
    return step, fields
