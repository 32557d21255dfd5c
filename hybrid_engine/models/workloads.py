"""Workloads: everything the driver needs to train one kind of model, as one value.

A `Workload` bundles the whole model (on the meta device: each rank materializes only its stages), the loss spec,
the model's tensor-parallel function and stage layout (torchtitan's one function per model, not flags threaded
through the engine), the data source, the numbers for metrics and what a checkpoint must record. The driver does

    workload = gpt_workload(GPTConfig(...), data_path, sequence_parallel=..., recompute=...)   # or mlp_workload
    check_gpt(cfg, grid, sequence_parallel, virtual_stages)       # GPT only, before the first collective
    engine = Engine(workload.model, workload.loss, groups, ...,
                    stages=StageConfig(impl, recompute=workload.full_recompute or <the run's --recompute>),
                    **workload.engine_kwargs(pp * virtual_stages))
    x, y = workload.draw(step, start, stop, inputs=engine.holds_first_stage, targets=engine.holds_last_stage,
                         dtype=<half dtype with half weights, else fp32>, device=device)
    checkpoint.save(engine, root, step, {"model": workload.checkpoint_model, "optimizer": name})

and, on rank 0, prints `workload.describe()` and `workload.describe_layout(pp * virtual_stages)`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from . import losses
from hybrid_engine.parallel.pipeline.balance import balanced_partition, describe_layout
from hybrid_engine.data import DataError, TokenDataset, load_tokens, open_dataset
from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models.gpt.flops import gpt_flops_per_token, gpt_param_count
from .memory_estimate import gpt_weight_bytes, refuse_if_too_large
from . import SyntheticRegression, large_linear_model
from hybrid_engine.models.gpt.model import Block, GPTConfig, build_gpt, layer_costs
from hybrid_engine.parallel.pipeline.partition import partition
from hybrid_engine.parallel.tensor.layers import parallelize_mlp

RECOMPUTE = ("none", "full", "selective")


@dataclass(frozen=True)
class ParallelizeGPT:
    """A GPT stage over the MP group (tp_transformer.parallelize_gpt), with selective recompute switched on in
    its blocks when asked (the attention core recomputed in backward, every other activation kept)."""

    sequence_parallel: bool = False
    selective_recompute: bool = False
    fp32_residual: bool = False

    def __call__(self, stage: nn.Sequential, mp_group) -> nn.Sequential:
        from hybrid_engine.models.gpt.parallelize import ParallelEmbedding, parallelize_gpt

        out = parallelize_gpt(stage, mp_group, self.sequence_parallel)
        for module in out:
            if isinstance(module, Block) and self.selective_recompute:
                module.recompute_attention_core = True
            if isinstance(module, ParallelEmbedding) and self.fp32_residual:
                module.fp32_residual = True
        return out


@dataclass
class Workload:
    """One trainable workload. `model` is on the meta device; `data` has `draw(step, start, stop, ...)` and
    `batch(step, batch_size, start, stop, ...)` (and, for text, `val_batch` / `val_batches`)."""

    name: str  # "mlp" | "gpt"
    model: nn.Sequential
    loss: losses.LossSpec
    parallelize: Callable[[nn.Sequential, object], nn.Sequential]
    layout_fn: Optional[Callable[[int], list[list[int]]]]  # num_stages -> module indices per stage; None: by count
    data: object
    flops_per_sample: float  # model FLOPs of one training sample (forward + backward)
    tokens_per_sample: int  # 1 for the MLP, seq_len for the GPT
    checkpoint_model: dict  # run_info["model"] of hybrid_engine.checkpoint.saving.save: what a checkpoint must match
    summary: str
    layer_names: list[str]
    layer_costs: list[float]
    full_recompute: bool = False  # StageConfig.recompute for this workload's own recompute option
    cfg: Optional[GPTConfig] = None  # the GPT's shape (None for the MLP)
    checkpoint_data: Optional[dict] = None  # run_info["data"]: what the model trains on (None: the seed says it)

    @property
    def flops_per_token(self) -> float:
        return self.flops_per_sample / self.tokens_per_sample

    @property
    def has_validation(self) -> bool:
        return hasattr(self.data, "val_batch")

    def describe(self) -> str:
        """One line for rank 0: the model, its data and its options."""
        return self.summary

    def layout(self, num_stages: int) -> list[list[int]]:
        """Module indices of each stage."""
        return self.layout_fn(num_stages) if self.layout_fn is not None else partition(self.model, num_stages)

    def describe_layout(self, num_stages: int) -> str:
        return describe_layout(self.layer_names, self.layer_costs, self.layout(num_stages))

    def engine_kwargs(self, num_stages: int) -> dict:
        """Engine(..., **this): the model's parallelize function and its stage layout."""
        return {"parallelize": self.parallelize,
                "layout": self.layout_fn(num_stages) if self.layout_fn is not None else None}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's full shape (the meta model's state_dict): what checkpoint.check_compatible takes."""
        return {k: tuple(v.shape) for k, v in self.model.state_dict().items()}

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        """(inputs, targets) of rows [start, stop) of step `step`'s global batch, each only if asked (else None).
        Float data comes in `dtype`; token data is int64 (dtype does not apply) on `device`."""
        if isinstance(self.data, TokenDataset):
            return self.data.draw(step, start, stop, inputs=inputs, targets=targets, device=device)
        return self.data.draw(step, start, stop, inputs=inputs, targets=targets, dtype=dtype)


def mlp_workload(dim: int, depth: int, seed: int, device: torch.device | str = "cpu") -> Workload:
    """The course MLP: depth x (Linear(dim, dim) + ReLU) against SyntheticRegression, built-in MSE, cut by layer
    count, split by parallelize_mlp (exactly what the driver did before workloads)."""
    model = large_linear_model(dim, depth, seed)
    names = [f"{i}:{type(m).__name__}" for i, m in enumerate(model)]
    costs = [1.0 if any(True for _ in m.parameters()) else 0.0 for m in model]
    return Workload(
        name="mlp", model=model, loss=losses.MSE(), parallelize=parallelize_mlp, layout_fn=None,
        data=SyntheticRegression(dim, seed, device), flops_per_sample=6.0 * dim * dim * depth, tokens_per_sample=1,
        checkpoint_model={"name": "large_linear_model", "dim": dim, "depth": depth, "seed": seed},
        summary=f"model: MLP, {depth} x Linear({dim}, {dim}) + ReLU, synthetic regression (seed {seed})",
        layer_names=names, layer_costs=costs)


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
                 recompute: str = "none", fp32_residual: bool = False) -> Workload:
    """A GPT of shape `cfg` on `data`: a text or token file path, a ready TokenDataset, or None for the built-in
    Markov corpus of seed cfg.seed (vocabulary 256, known entropy rate). The vocabulary is the data's:
    cfg.vocab_size is replaced by it. Windows are cfg.seq_len + 1 tokens drawn from (cfg.seed, step).

    recompute: "none"; "full" (every stage keeps only its input: `full_recompute`, for StageConfig.recompute);
    "selective" (keep everything but the attention core, Megatron's selective recompute). The loss is the
    vocab-parallel cross-entropy; stages are cut by `balanced_partition(layer_costs(cfg), n)`. fp32_residual: the
    residual stream stays fp32 under half weights (models/gpt.py, Embedding.fp32_residual); the stages then
    exchange fp32 activations."""
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if not isinstance(data, TokenDataset):
        try:
            data = open_dataset(data, cfg.seq_len, cfg.seed)
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    elif data.seq_len != cfg.seq_len:
        raise ConfigError(f"the dataset's seq_len {data.seq_len} differs from the GPT's {cfg.seq_len}")
    cfg = dataclasses.replace(cfg, vocab_size=data.vocab_size)
    costs = layer_costs(cfg)
    params = gpt_param_count(cfg)
    summary = (f"model: GPT, {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq_len}, "
               f"vocab {cfg.vocab_size}, {'tied' if cfg.tie_embeddings else 'untied'} embeddings, "
               f"{params / 1e6:.3g}M parameters; data {data.name}; sequence parallel "
               f"{'on' if sequence_parallel else 'off'}; recompute {recompute}"
               f"{'; residual stream fp32' if fp32_residual else ''}")
    return Workload(
        name="gpt", model=build_gpt(cfg, "meta"), loss=losses.VocabParallelCrossEntropy(cfg.vocab_size),
        parallelize=ParallelizeGPT(sequence_parallel, recompute == "selective", fp32_residual),
        layout_fn=lambda num_stages: balanced_partition(costs, num_stages), data=data,
        flops_per_sample=gpt_flops_per_token(cfg) * cfg.seq_len, tokens_per_sample=cfg.seq_len,
        checkpoint_model=gpt_checkpoint_model(cfg), summary=summary,
        layer_names=["embedding"] + [f"block {i}" for i in range(1, cfg.layers + 1)] + ["head"],
        layer_costs=costs, full_recompute=recompute == "full", cfg=cfg,
        checkpoint_data={"name": data.name, "tokens": len(data.tokens), "vocab_size": data.vocab_size,
                         "fingerprint": data.fingerprint, "tokenizer_sha256": data.tokenizer_sha256})


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
    if cfg.layers + 2 < pp * virtual_stages:
        raise ConfigError(f"the GPT has {cfg.layers + 2} layers (embedding, {cfg.layers} blocks, head) but the "
                          f"pipeline needs at least one per stage (pp x virtual stages = {pp * virtual_stages})")
    vocab = 256  # the built-in corpus's
    if data_path is not None:
        try:
            tokens, vocab = load_tokens(data_path)
            TokenDataset(tokens, vocab, cfg.seq_len, 0, name=data_path)
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    shape = GPTConfig(vocab, cfg.layers, cfg.hidden, cfg.heads, cfg.seq_len, bool(cfg.tie_embeddings))
    too_large = refuse_if_too_large(
        f"the GPT ({cfg.layers} layers, hidden {cfg.hidden}, vocabulary {vocab}"
        f"{' of --data ' + data_path if data_path else ''}) on pp x mp = {pp} x {mp}",
        gpt_weight_bytes(shape, pp, mp), device_type, " per rank")
    if too_large:
        raise ConfigError(f"{too_large}: smaller flags, more --pp/--mp, or (a vocabulary this large) a damaged "
                          "token file")
