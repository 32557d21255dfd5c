"""The Llama as a workload: its model on the meta device, the vocab-parallel loss, its data, its cost-balanced cut
and its tensor-parallel function, from the run's configuration; what a checkpoint records of it; its rules; and its
shape as the planner sees it."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

import torch
from torch import nn

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.data import TokenDataset
from hybrid_engine.kernels.apply import loss_for
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models import losses
from hybrid_engine.models.memory_estimate import weight_bytes
from hybrid_engine.models.op_count import dispatched_ops
from hybrid_engine.models.token_workload import (check_stage_count, checkpoint_data, data_vocab, open_token_data,
                                                 refuse_if_weights_too_large)
from hybrid_engine.models.planner_shape import (ModelShape, decoder_shape, fp8_gemms, planned_for_gpu,
                                                 planned_kernels)
from hybrid_engine.models.workload import Workload
from hybrid_engine.parallel.pipeline.units import LayoutRule
from hybrid_engine.parallel.tensor.plan import sequence_param_count

from .config import Llama3Scaling, LlamaConfig
from .flops import llama_flops_per_token, llama_matmul_params, llama_param_count
from .model import Block, check_split, half_costs, layer_costs
from .parallelize import ParallelizeLlama, build_llama, llama_plan

RECOMPUTE = ("none", "full", "selective")
SHAPE_KEYS = ("vocab_size", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "tie_embeddings",
              "rope_theta", "norm_eps", "max_positions", "qkv_bias")


def llama_checkpoint_model(cfg: LlamaConfig) -> dict:
    """run_info["model"] of a Llama checkpoint: its whole shape (not the sequence length trained on, which no
    parameter depends on), what `sample`, `hf export` and a run that loads it rebuild it from."""
    scaling = cfg.rope_scaling.text() if cfg.rope_scaling else None
    return {"name": "llama", **{k: getattr(cfg, k) for k in SHAPE_KEYS}, "rope_scaling": scaling, "seed": cfg.seed}


def llama_config_of(model: dict, seq_len: int | None = None) -> LlamaConfig:
    """Inverse of llama_checkpoint_model; seq_len (the RoPE tables' length) defaults to max_positions, at most 4096
    (longer sequences compute theirs when they come)."""
    if model.get("name") != "llama":
        raise ValueError(f"not a Llama checkpoint: its model is {model.get('name')!r}")
    ints = {k: int(model[k]) for k in ("vocab_size", "layers", "hidden", "heads", "kv_heads", "head_dim",
                                       "ffn_hidden", "max_positions")}
    scaling = model.get("rope_scaling")
    return LlamaConfig(**{k: v for k, v in ints.items() if k != "max_positions"},
                       seq_len=seq_len or min(ints["max_positions"], 4096), tie_embeddings=bool(model["tie_embeddings"]),
                       rope_theta=float(model["rope_theta"]), norm_eps=float(model["norm_eps"]),
                       rope_scaling=Llama3Scaling.parse(scaling) if scaling else None,
                       max_positions=ints["max_positions"], qkv_bias=bool(model.get("qkv_bias", False)),
                       seed=int(model.get("seed", 0)))


def llama_weight_bytes(cfg: LlamaConfig) -> float:
    """Bytes of the dense Llama's weights (what sampling a checkpoint of it loads)."""
    return weight_bytes(llama_param_count(cfg), cfg.vocab_size, cfg.hidden)


def llama_workload(cfg: LlamaConfig, data: str | TokenDataset | None = None, *, sequence_parallel: bool = False,
                   recompute: str = "none", vocab_from_data: bool = True,
                   kernels: KernelOptions = KernelOptions(), split_blocks: str = "auto") -> Workload:
    """A Llama of shape `cfg` on `data` (a text or token file path, a ready TokenDataset, or None for the built-in
    Markov corpus of cfg.seed). vocab_from_data: the vocabulary is the data's (cfg.vocab_size replaced by it);
    else cfg.vocab_size, which must hold the data's ids. recompute: none | full | selective (RoPE and the
    attention core rerun in backward). kernels: the fused kernels and fp8 GEMMs (kernels/options.py)."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    data = open_token_data(data, cfg.seq_len, cfg.seed)
    if vocab_from_data:
        cfg = dataclasses.replace(cfg, vocab_size=data.vocab_size)
    elif data.vocab_size > cfg.vocab_size:
        raise ConfigError(f"the data's vocabulary {data.vocab_size} is larger than the Llama's {cfg.vocab_size}")
    costs = layer_costs(cfg)
    summary = (f"model: Llama, {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads ({cfg.kv_heads} kv), "
               f"head dim {cfg.head_dim}, ffn {cfg.ffn_hidden}, seq {cfg.seq_len}, vocab {cfg.vocab_size}, "
               f"{'tied' if cfg.tie_embeddings else 'untied'} embeddings, RoPE theta {cfg.rope_theta:g}"
               f"{' llama3-scaled ' + cfg.rope_scaling.text() if cfg.rope_scaling else ''}, "
               f"{llama_param_count(cfg) / 1e6:.3g}M parameters; data {data.name}; sequence parallel "
               f"{'on' if sequence_parallel else 'off'}; recompute {recompute}; {kernels.describe()}")
    return Workload(
        name="llama", model=(model := build_llama(cfg, "meta")),
        loss=loss_for(losses.VocabParallelCrossEntropy(cfg.vocab_size), kernels),
        parallelize=ParallelizeLlama(sequence_parallel, recompute == "selective", kernels),
        layout_fn=LayoutRule.of(model, costs, half_costs(cfg), split_blocks), data=data,
        flops_per_sample=llama_flops_per_token(cfg) * cfg.seq_len, tokens_per_sample=cfg.seq_len,
        checkpoint_model=llama_checkpoint_model(cfg), summary=summary,
        layer_names=["embedding"] + [f"block {i}" for i in range(1, cfg.layers + 1)] + ["head"],
        layer_costs=costs, full_recompute=recompute == "full", cfg=cfg,
        checkpoint_data=checkpoint_data(data))


def config_of_options(m, seed: int, vocab_size: int) -> LlamaConfig:
    """The LlamaConfig of a run's options (m: LlamaOptions), on a vocabulary of `vocab_size`."""
    return LlamaConfig(vocab_size, m.layers, m.hidden, m.heads, m.resolved_kv_heads(), m.resolved_ffn_hidden(),
                       m.seq_len, m.tie_embeddings, m.rope_theta,
                       Llama3Scaling.parse(m.rope_scaling) if m.rope_scaling else None, m.norm_eps, m.head_dim,
                       m.max_positions, m.qkv_bias, seed)


def build(cfg, device: torch.device | str = "cpu") -> Workload:
    """The workload of a run (cfg: RunConfig whose [model] is the Llama)."""
    m = cfg.model.options
    shape = config_of_options(m, cfg.model.seed, m.vocab_size or 1)
    kernels = m.kernels(torch.device(device).type, mp=cfg.parallel.mp, zero=cfg.data_parallel.zero)
    return llama_workload(shape, cfg.data.path, sequence_parallel=m.sequence_parallel,
                          recompute=cfg.stages.recompute, vocab_from_data=not m.vocab_size, kernels=kernels,
                          split_blocks=cfg.stages.split_blocks)


# The shape's names in LlamaConfig's and check_split's messages (each spelled as its flag, without the dashes).
_SHAPE_WORDS = re.compile(r"(?<![\w-])(vocab-size|layers|hidden|heads|kv-heads|ffn-hidden|seq-len|head-dim|"
                          r"rope-theta|norm-eps|max-positions)(?![\w-])")


def as_flags(message: str) -> str:
    """A shape message of the Llama's in the flags' words: every field named as the flag a user typed."""
    message = message.replace("the model-parallel size", "--mp").removeprefix("Llama ")
    return _SHAPE_WORDS.sub(r"--\1", message)


def check(cfg, grid, device_type: str) -> None:
    """The Llama's rules on this grid and its data, before any collective; one ConfigError line each."""
    m, mp, pp = cfg.model.options, grid.mp_size, grid.pp_size
    for name in ("layers", "hidden", "heads", "seq_len"):
        value = getattr(m, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    try:
        shape = config_of_options(m, cfg.model.seed, 1)
        check_split(shape, mp)
    except ValueError as exc:
        raise ConfigError(as_flags(str(exc))) from None
    m.kernels(device_type, cfg.plan.card)  # fp8 on a card without it: refused here (a Hopper planned for: has it)
    if m.sequence_parallel and m.seq_len % mp:
        raise ConfigError(f"--sequence-parallel: --seq-len {m.seq_len} is not divisible by --mp {mp}")
    if m.seq_len > shape.max_positions:
        raise ConfigError(f"--seq-len {m.seq_len} is longer than --max-positions {shape.max_positions}")
    check_stage_count("Llama", m.layers, pp * cfg.schedule.chunks)
    vocab = data_vocab(cfg.data.path, m.seq_len)
    if m.vocab_size and vocab > m.vocab_size:
        raise ConfigError(f"--vocab-size {m.vocab_size} is smaller than the vocabulary of the data ({vocab})")
    shape = dataclasses.replace(shape, vocab_size=m.vocab_size or vocab)
    refuse_if_weights_too_large(f"the Llama ({m.layers} layers, hidden {m.hidden}, vocabulary {shape.vocab_size}) on "
                                f"pp x mp = {pp} x {mp}", weight_bytes(llama_param_count(shape), shape.vocab_size,
                                                                       m.hidden, pp, mp), device_type)


def shape(cfg) -> ModelShape:
    """The planner's view of a run of the Llama (cfg: RunConfig), on --vocab-size or its data's vocabulary."""
    m = cfg.model.options
    c = config_of_options(m, cfg.model.seed, m.vocab_size or data_vocab(cfg.data.path, m.seq_len))
    block = (llama_matmul_params(c) - c.hidden - c.vocab_size * c.hidden) // c.layers
    kernels = planned_kernels(cfg)
    acts = block_activations(c, kernels.fused and kernels.elementwise, m.sequence_parallel, kernels.fp8 is not None)
    return decoder_shape("llama", c.layers, c.hidden, c.seq_len, c.vocab_size, block, c.ffn_hidden,
                         c.tie_embeddings, layer_costs(c), llama_flops_per_token(c), block_acts=acts,
                         kv_width=2 * c.kv_heads * c.head_dim, fused_loss=kernels.fused,
                         fp8=fp8_gemms(kernels, *block_linears(c)), sequence_params=sequence_params(c),
                         host_ops=block_ops(c, kernels, cfg.precision.amp != "off") if planned_for_gpu(cfg)
                         else (0, 0, 0), half_shares=half_costs(c), split_blocks=cfg.stages.split_blocks)


def sequence_params(c: LlamaConfig) -> int:
    """A block's parameter tensors used on a sequence chunk under sequence parallelism, counted on its plan."""
    block = Block(c, 1, device="meta")
    return sequence_param_count(block, llama_plan(block, 1))


@lru_cache(maxsize=32)
def block_ops(c: LlamaConfig, kernels: KernelOptions, half: bool) -> tuple[int, int, int]:
    """(forward, backward, backward without its weight gradients) aten operators a block dispatches a micro-batch
    as the run builds it (models/op_count.py), counted on a block of c's heads at 8 features a head; (0, 0) where
    it runs compiled regions (fused elementwise modules, fp8's quantization): a compiled call's host cost is not an
    operator's, and is not counted."""
    if kernels.compiled and ((kernels.fused and kernels.elementwise) or kernels.fp8 is not None):
        return 0, 0, 0
    small = dataclasses.replace(c, layers=1, hidden=8 * c.heads, head_dim=8, ffn_hidden=16, seq_len=16,
                                vocab_size=64, max_positions=0)
    block = Block(small, 1)
    block.reset_buffers()
    eager = dataclasses.replace(kernels, fused=kernels.fused and kernels.elementwise, fp8=None)
    stage = ParallelizeLlama(kernels=eager)(nn.Sequential(block), None).to(torch.bfloat16 if half else torch.float32)
    return dispatched_ops(stage, torch.randn(2, small.seq_len, small.hidden, dtype=stage[0].norm_attn.weight.dtype))


def block_linears(c: LlamaConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """A block's linear layers as (in, out) features, (column-parallel, row-parallel): the q and kv projections,
    the SwiGLU's gate and up; the out projection and the SwiGLU's down (models/llama/parallelize.py). A kv
    projection replicated over MP (fewer kv heads than MP ranks) is counted as split."""
    q, kv, h, f = c.heads * c.head_dim, c.kv_heads * c.head_dim, c.hidden, c.ffn_hidden
    return [(h, q), (h, 2 * kv), (h, f), (h, f)], [(q, h), (f, h)]


def block_activations(c: LlamaConfig, fused_swiglu: bool = False, sequence_parallel: bool = False,
                      fp8: bool = False) -> tuple[float, float]:
    """(split over MP, whole) elements a block keeps per token for its backward, as Block runs it eagerly: the
    rotated q and k, the kv projection (v is a view of it), SDPA's output and its reshaped copy (the out
    projection's input); the SwiGLU's gate, silu(gate), up and their product (fused: the region keeps gate and up,
    the down projection the product); whole: each RMSNorm's input and output. Under sequence parallelism each
    norm's input is a sequence chunk (split over MP) and its output is kept gathered by the projection after it.
    The Llama-1B shape measured 1.5 MB a token at 16 layers against 1.6 MB from these counts. fp8: each projection
    keeps its input for dw in fp8 (half an element a value) instead of the input itself, which the out and down
    projections' inputs (SDPA's reshaped output, the SwiGLU product) have no other keeper of; the norms' outputs,
    each read by two projections, are kept twice in fp8 instead of once: the same bytes."""
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    split = 3.0 * q + 3.0 * kv + (3.0 if fused_swiglu else 4.0) * c.ffn_hidden
    if fp8:
        split -= 0.5 * (q + c.ffn_hidden)
    if sequence_parallel:
        return split + 2.0 * c.hidden, 2.0 * c.hidden
    return split, 4.0 * c.hidden
