"""A workload: everything the driver needs to train one kind of model, as one value.

A `Workload` bundles the whole model (on the meta device: each rank materializes only its stages), the loss spec,
the model's tensor-parallel function and stage layout (torchtitan's one function per model, not flags threaded
through the engine), the data source, the numbers for metrics and what a checkpoint must record. Each model's
folder builds its own (models/<name>/workload.py); the registry (models/registry.py) finds it by name. The driver does

    workload = registry.build_workload(cfg, device)            # after registry.check_model, before any collective
    engine = Engine(workload.model, workload.loss, groups, ..., **workload.engine_kwargs(pp * virtual_stages))
    x, y = workload.draw(step, start, stop, inputs=engine.holds_first_stage, targets=engine.holds_last_stage,
                         dtype=<half dtype with half weights, else fp32>, device=device)
    checkpoint.save(engine, root, step, {"model": workload.checkpoint_model, "optimizer": name})

and, on rank 0, prints `workload.describe()` and `workload.describe_layout(pp * virtual_stages)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from hybrid_engine.data import TokenDataset
from hybrid_engine.parallel.pipeline.balance import describe_layout
from hybrid_engine.parallel.pipeline.partition import partition
from hybrid_engine.parallel.pipeline.units import LayoutRule

from . import losses


@dataclass
class Workload:
    """One trainable workload. `model` is on the meta device; `data` has `draw(step, start, stop, ...)` and
    `batch(step, batch_size, start, stop, ...)` (and, for text, `val_batch` / `val_batches`)."""

    name: str  # the model's registry name
    model: nn.Sequential
    loss: losses.LossSpec
    parallelize: Callable[[nn.Sequential, object], nn.Sequential]
    # num_stages -> module indices per stage, or a units.LayoutRule (which also takes the pipeline ranks and the
    # placement, and may cut blocks into halves); None: by count
    layout_fn: Optional[Callable[..., list[list]]]
    data: object
    flops_per_sample: float  # model FLOPs of one training sample (forward + backward)
    tokens_per_sample: int  # 1 for the MLP, seq_len for the token models
    checkpoint_model: dict  # run_info["model"] of hybrid_engine.checkpoint.saving.save: what a checkpoint must match
    summary: str
    layer_names: list[str]
    layer_costs: list[float]
    full_recompute: bool = False  # StageConfig.recompute for this workload's own recompute option
    cfg: Optional[object] = None  # the model's shape (GPTConfig, LlamaConfig; None for the MLP)
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

    def layout(self, num_stages: int, pp: int | None = None, placement: str = "loop") -> list[list]:
        """Module indices of each of `num_stages` stages over `pp` pipeline ranks (None: one stage a rank) placed
        by `placement` (the schedule's); a block cut between two stages is named by its halves (units.Half)."""
        if self.layout_fn is None:
            return partition(self.model, num_stages)
        if isinstance(self.layout_fn, LayoutRule):
            return self.layout_fn(num_stages, pp, placement)
        return self.layout_fn(num_stages)

    def describe_layout(self, num_stages: int, pp: int | None = None, placement: str = "loop") -> str:
        """A line per stage, and one that says which blocks the stages cut (where they cut any)."""
        rule = self.layout_fn if isinstance(self.layout_fn, LayoutRule) else None
        lines = [describe_layout(self.layer_names, self.layer_costs, self.layout(num_stages, pp, placement),
                                 rule.shares if rule else None)]
        note = rule.describe(num_stages, pp, placement) if rule else None
        return "\n".join(lines + ([note] if note else []))

    def engine_kwargs(self, num_stages: int, pp: int | None = None, placement: str = "loop") -> dict:
        """Engine(..., **this): the model's parallelize function and its stage layout."""
        return {"parallelize": self.parallelize,
                "layout": self.layout(num_stages, pp, placement) if self.layout_fn is not None else None}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's full shape (the meta model's state_dict): what checkpoint.check_compatible takes."""
        return {k: tuple(v.shape) for k, v in self.model.state_dict().items()}

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", chunks: tuple[int, int] = (0, 1)):
        """(inputs, targets) of rows [start, stop) of step `step`'s global batch, each only if asked (else None).
        Float data comes in `dtype`; token data is int64 (dtype does not apply) on `device`, and with chunks (cp
        rank, cp) that context-parallel rank's tokens of each sequence only."""
        if isinstance(self.data, TokenDataset):
            return self.data.draw(step, start, stop, inputs=inputs, targets=targets, device=device, chunks=chunks)
        return self.data.draw(step, start, stop, inputs=inputs, targets=targets, dtype=dtype)
