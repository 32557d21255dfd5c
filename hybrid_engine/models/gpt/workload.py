"""The GPT as a workload: its model on the meta device, its vocab-parallel loss, its data, its cost-balanced cut and
its tensor-parallel function, from the run's configuration; what a checkpoint records of it; its rules; and its
shape as the planner sees it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn as nn

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.data import TokenDataset
from hybrid_engine.kernels.apply import apply_kernels, loss_for
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models import losses
from hybrid_engine.models.memory_estimate import gpt_weight_bytes
from hybrid_engine.models.op_count import dispatched_ops
from hybrid_engine.models.token_workload import (check_stage_count, checkpoint_data, data_vocab, open_token_data,
                                                 refuse_if_weights_too_large)
from hybrid_engine.models.planner_shape import (ModelShape, decoder_shape, fp8_gemms, planned_for_gpu,
                                                 planned_kernels)
from hybrid_engine.models.workload import Workload
from hybrid_engine.parallel.pipeline.units import LayoutRule
from hybrid_engine.parallel.tensor.plan import sequence_param_count

from .flops import gpt_flops_per_token, gpt_param_count
from .model import Block, Embedding, GPTConfig, half_costs, layer_costs
from .parallelize import build_gpt, gpt_plan, parallelize_gpt

RECOMPUTE = ("none", "full", "selective")


@dataclass(frozen=True)
class ParallelizeGPT:
    """A GPT stage over the MP group (models/gpt/parallelize.py), with selective recompute switched on in
    its blocks when asked (the attention core recomputed in backward, every other activation kept), then the
    kernels pass (the fused loss's head, fp8 GEMMs) the run's KernelOptions ask for."""

    sequence_parallel: bool = False
    selective_recompute: bool = False
    fp32_residual: bool = False
    kernels: KernelOptions = KernelOptions()

    def __call__(self, stage: nn.Sequential, mp_group) -> nn.Sequential:
        out = parallelize_gpt(stage, mp_group, self.sequence_parallel)
        for module in out:
            if isinstance(module, Block) and self.selective_recompute:
                module.recompute_attention_core = True
            if isinstance(module, Embedding) and self.fp32_residual:
                module.fp32_residual = True
        return apply_kernels(out, self.kernels) if self.kernels.any else out


def gpt_checkpoint_model(cfg: GPTConfig) -> dict:
    """run_info["model"] of a GPT checkpoint: everything `python -m hybrid_engine.sample` needs to rebuild it."""
    return {"name": "gpt", "vocab_size": cfg.vocab_size, "layers": cfg.layers, "hidden": cfg.hidden,
            "heads": cfg.heads, "seq_len": cfg.seq_len, "tie_embeddings": cfg.tie_embeddings, "seed": cfg.seed}


def gpt_config_of(model: dict) -> GPTConfig:
    """Inverse of gpt_checkpoint_model."""
    if model.get("name") != "gpt":
        raise ValueError(f"not a GPT checkpoint: its model is {model.get('name')!r}")
    return GPTConfig(int(model["vocab_size"]), int(model["layers"]), int(model["hidden"]), int(model["heads"]),
                     int(model["seq_len"]), bool(model["tie_embeddings"]), int(model["seed"]))


def gpt_workload(cfg: GPTConfig, data: str | TokenDataset | None = None, *, sequence_parallel: bool = False,
                 recompute: str = "none", fp32_residual: bool = False,
                 kernels: KernelOptions = KernelOptions(), split_blocks: str = "auto") -> Workload:
    """A GPT of shape `cfg` on `data`: a text or token file path, a ready TokenDataset, or None for the built-in
    Markov corpus of seed cfg.seed (vocabulary 256, known entropy rate). The vocabulary is the data's:
    cfg.vocab_size is replaced by it. Windows are cfg.seq_len + 1 tokens drawn from (cfg.seed, step).

    recompute: "none"; "full" (every stage keeps only its input: `full_recompute`, for StageConfig.recompute);
    "selective" (keep everything but the attention core, Megatron's selective recompute). The loss is the
    vocab-parallel cross-entropy; stages are cut by `balanced_partition(layer_costs(cfg), n)`. fp32_residual: the
    residual stream stays fp32 under half weights (models/gpt.py, Embedding.fp32_residual); the stages then
    exchange fp32 activations. kernels: the fused loss and fp8 GEMMs (kernels/options.py)."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    data = open_token_data(data, cfg.seq_len, cfg.seed)
    cfg = dataclasses.replace(cfg, vocab_size=data.vocab_size)
    costs = layer_costs(cfg)
    params = gpt_param_count(cfg)
    summary = (f"model: GPT, {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq_len}, "
               f"vocab {cfg.vocab_size}, {'tied' if cfg.tie_embeddings else 'untied'} embeddings, "
               f"{params / 1e6:.3g}M parameters; data {data.name}; sequence parallel "
               f"{'on' if sequence_parallel else 'off'}; recompute {recompute}"
               f"{'; residual stream fp32' if fp32_residual else ''}; "
               f"{kernels.describe('', '(LayerNorm and GELU are one kernel each already)')}")
    return Workload(
        name="gpt", model=(model := build_gpt(cfg, "meta")),
        loss=loss_for(losses.VocabParallelCrossEntropy(cfg.vocab_size), kernels),
        parallelize=ParallelizeGPT(sequence_parallel, recompute == "selective", fp32_residual, kernels),
        layout_fn=LayoutRule.of(model, costs, half_costs(cfg), split_blocks), data=data,
        flops_per_sample=gpt_flops_per_token(cfg) * cfg.seq_len, tokens_per_sample=cfg.seq_len,
        checkpoint_model=gpt_checkpoint_model(cfg), summary=summary,
        layer_names=["embedding"] + [f"block {i}" for i in range(cfg.layers)] + ["head"],
        layer_costs=costs, full_recompute=recompute == "full", cfg=cfg,
        checkpoint_data=checkpoint_data(data))


def check_gpt(cfg, grid, sequence_parallel: bool = False, virtual_stages: int = 1,
              data_path: str | None = None, device_type: str = "cpu") -> None:
    """The GPT's bad-input checks, before any collective; raises ConfigError with one line.

    cfg: anything with .layers .hidden .heads .seq_len (a GPTConfig or the parsed flags); grid: anything with
    .mp_size and .pp_size (a ProcessGrid). data_path: a file that must exist, be non-empty, hold at least
    seq_len + 1 tokens (plus the held-out part) and no token id at or above its vocabulary (None: built-in).
    Last, the weights of the model on that data's vocabulary must fit a rank's memory at all."""
    mp, pp = grid.mp_size, grid.pp_size
    for name in ("layers", "hidden", "heads", "seq_len"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if cfg.hidden % cfg.heads:
        raise ConfigError(f"--hidden {cfg.hidden} is not divisible by --heads {cfg.heads}")
    if cfg.heads % mp:
        raise ConfigError(f"--heads {cfg.heads} is not divisible by --mp {mp} (each MP rank takes whole heads)")
    if sequence_parallel and cfg.seq_len % mp:
        raise ConfigError(f"--sequence-parallel: --seq-len {cfg.seq_len} is not divisible by --mp {mp}")
    check_stage_count("GPT", cfg.layers, pp * virtual_stages)
    vocab = data_vocab(data_path, cfg.seq_len)
    shape = GPTConfig(vocab, cfg.layers, cfg.hidden, cfg.heads, cfg.seq_len, bool(cfg.tie_embeddings))
    refuse_if_weights_too_large(f"the GPT ({cfg.layers} layers, hidden {cfg.hidden}, vocabulary {vocab}"
                                f"{' of --data ' + data_path if data_path else ''}) on pp x mp = {pp} x {mp}",
                                gpt_weight_bytes(shape, pp, mp), device_type)


def build(cfg, device: torch.device | str = "cpu") -> Workload:
    """The workload of a run (cfg: RunConfig whose [model] is the GPT); the vocabulary is the data's."""
    m = cfg.model.options
    shape = GPTConfig(256, m.layers, m.hidden, m.heads, m.seq_len, m.tie_embeddings, cfg.model.seed)
    kernels = m.kernels(torch.device(device).type, mp=cfg.parallel.mp, zero=cfg.data_parallel.zero)
    return gpt_workload(shape, cfg.data.path, sequence_parallel=m.sequence_parallel, recompute=cfg.stages.recompute,
                        fp32_residual=m.fp32_residual, kernels=kernels, split_blocks=cfg.stages.split_blocks)


def check(cfg, grid, device_type: str) -> None:
    """The GPT's rules on this grid and its data, before any collective (check_gpt), and its precision's."""
    m = cfg.model.options
    check_gpt(m, grid, m.sequence_parallel, cfg.schedule.chunks, cfg.data.path, device_type)
    m.kernels(device_type, cfg.plan.card)  # fp8 on a card without it: refused here (a Hopper planned for: has it)
    if m.fp32_residual and not cfg.precision.half_weights:
        why = ("--amp off keeps everything in fp32" if cfg.precision.amp == "off" else
               "--amp-impl autocast keeps fp32 weights, so the residual stream is fp32 already")
        raise ConfigError(f"--fp32-residual applies to --amp fp16|bf16 with half weights (--amp-impl "
                          f"half-weights) only: {why}")


def shape(cfg) -> ModelShape:
    """The planner's view of a run of the GPT (cfg: RunConfig), on its data's vocabulary (read from the data file's
    header, as the workload's will be)."""
    m = cfg.model.options
    g = GPTConfig(data_vocab(cfg.data.path, m.seq_len), m.layers, m.hidden, m.heads, m.seq_len, m.tie_embeddings)
    kernels, h = planned_kernels(cfg), g.hidden
    # fp8: the projections keep their inputs for dw in fp8, half the bytes; each input has no other keeper (the
    # LayerNorms keep their inputs): the qkv and fc1 inputs whole, the proj input and fc2's 4 h split over MP
    acts = (12.0 * h - 2.5 * h, 5.0 * h - h) if kernels.fp8 is not None else None
    block = Block(g, 1, device="meta")
    return decoder_shape("gpt", g.layers, h, g.seq_len, g.vocab_size, 12 * h**2 + 13 * h, 4 * h, g.tie_embeddings,
                         layer_costs(g), gpt_flops_per_token(g), positions=g.seq_len, block_acts=acts,
                         fused_loss=kernels.fused,
                         fp8=fp8_gemms(kernels, [(h, 3 * h), (h, 4 * h)], [(h, h), (4 * h, h)]),
                         sequence_params=sequence_param_count(block, gpt_plan(block, True)),
                         host_ops=block_ops(g.heads, kernels, cfg.precision.amp != "off") if planned_for_gpu(cfg)
                         else (0, 0, 0), half_shares=half_costs(g), split_blocks=cfg.stages.split_blocks)


@lru_cache(maxsize=32)
def block_ops(heads: int, kernels: KernelOptions, half: bool) -> tuple[int, int, int]:
    """(forward, backward, backward without its weight gradients) aten operators a block dispatches a micro-batch
    (models/op_count.py), counted on a block of `heads` heads at 8 features a head; (0, 0) under fp8 with compiled
    quantization (a compiled call's host cost is not an operator's, and is not counted)."""
    if kernels.compiled and kernels.fp8 is not None:
        return 0, 0, 0
    small = GPTConfig(64, 1, 8 * heads, heads, 16)
    stage = parallelize_gpt(nn.Sequential(Block(small, 1)), None).to(torch.bfloat16 if half else torch.float32)
    return dispatched_ops(stage, torch.randn(2, small.seq_len, small.hidden, dtype=stage[0].ln1.weight.dtype))
