"""Megatron-core 0.16.1's GPTModel configured as a Llama, with the local layer spec (no TransformerEngine, no apex),
at any tp x pp (CUDA only). The step, the pipeline schedule and the optimizer's wiring are megatron_gpt.py's.

The Llama: RMSNorm (normalization="RMSNorm", get_gpt_layer_local_spec(normalization="RMSNorm")), SwiGLU
(gated_linear_unit with silu), rotary position embeddings (position_embedding_type="rope", rotary_base), grouped-
query attention (num_query_groups), no biases, untied head; bf16 (Float16Module), its DDP with fp32 gradients, its
bf16 optimizer over torch's Adam (fp32 masters) with the engine's recipe: weight decay 0.1 (Megatron leaves norms
and biases undecayed, as the engine does; it decays the embedding, which the engine does not), betas 0.9/0.95,
clipping at 1.0.

What the local spec refuses without TransformerEngine or apex, and what is used instead:
- sequence parallelism: its norm (WrappedTorchNorm, torch.nn.RMSNorm underneath) asserts `not sequence_parallel`;
  these peers run without it (the pp2 x tp2 comparison does too).
- fused RoPE (apply_rope_fusion): TransformerEngine's kernel; the unfused torch RoPE is used.
- flash / fused attention: the local DotProductAttention materialises the [s, s] scores (masked softmax unfused
  without apex's kernels); there is no SDPA in the local spec.
- kv heads fewer than tp: num_query_groups must be divisible by tp (Megatron's `divide`); the 1B shape's 8 kv
  heads split over tp 2 and 4.
Every megatron import is inside a function: importing this file needs no megatron.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import common  # noqa: F401  (puts the repository on sys.path)
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.model import layer_costs
from hybrid_engine.parallel.pipeline.balance import balanced_partition

RECIPE = {"weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "clip_grad": 1.0}


def engine_cut(cfg: LlamaConfig, stages: int) -> list[list[int]]:
    """The engine's pipeline cut of the Llama (balance over models.llama.model.layer_costs)."""
    return balanced_partition(layer_costs(cfg), stages)


def build_model(cfg: LlamaConfig, lr: float, device: torch.device, *, tp: int = 1, pp: int = 1,
                sequence_parallel: bool = False, first_stage_layers: int | None = None,
                clip_grad: float | None = None):
    """(DDP-wrapped model of this rank's stage, its optimizer, the TransformerConfig); megatron_gpt.build_model's
    signature. clip_grad None: the recipe's 1.0."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    if sequence_parallel:
        common.fail("megatron llama: the local spec's RMSNorm refuses sequence parallelism without TE or apex")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
    uneven = {"num_layers_in_first_pipeline_stage": first_stage_layers} if pp > 1 and first_stage_layers else {}
    tcfg = TransformerConfig(num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
                             num_query_groups=cfg.kv_heads, kv_channels=cfg.head_dim, ffn_hidden_size=cfg.ffn_hidden,
                             normalization="RMSNorm", layernorm_epsilon=cfg.norm_eps, gated_linear_unit=True,
                             activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
                             bias_activation_fusion=False, apply_rope_fusion=False, bf16=True,
                             params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, hidden_dropout=0.0,
                             attention_dropout=0.0, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             deallocate_pipeline_outputs=pp > 1, **uneven)
    model = GPTModel(config=tcfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=cfg.vocab_size, max_sequence_length=cfg.seq_len,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), position_embedding_type="rope",
                     rotary_base=int(cfg.rope_theta), share_embeddings_and_output_weights=cfg.tie_embeddings).to(device)
    model = Float16Module(tcfg, model)
    model = DistributedDataParallel(tcfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    tcfg.no_sync_func = model.no_sync
    tcfg.finalize_model_grads_func = finalize_model_grads
    recipe = dict(RECIPE, clip_grad=RECIPE["clip_grad"] if clip_grad is None else clip_grad)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=lr, bf16=True, **recipe), [model])
    return model, opt, tcfg


def build_step(a, cfg: LlamaConfig, device: torch.device, *, pp: int, tp: int):
    """megatron_gpt.build_step over this model: (step(inputs, targets) -> loss on every rank, the record's fields)."""
    import megatron_gpt

    step, fields = megatron_gpt.build_step(a, cfg, device, pp=pp, tp=tp, sequence_parallel=False, build=build_model,
                                           cut=engine_cut, clip_grad=RECIPE["clip_grad"])
    fields.update(system=f"megatron-llama{'-' + fields['system'].split('-', 1)[1] if pp * tp > 1 else ''}",
                  optimizer="Megatron bf16 optimizer over torch AdamW (fp32 masters), weight decay 0.1 (norms and "
                            "biases undecayed), betas 0.9/0.95, clipping 1.0",
                  spec="local (no TransformerEngine, no apex): torch RMSNorm, unfused RoPE, unfused attention")
    return step, fields
