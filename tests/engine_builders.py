"""One place where tests build engines from flat keyword arguments (the test matrices are flat tables), and the
fault they inject through the engine's public post-backward hook."""
from __future__ import annotations

import torch
import torch.nn as nn

from hybrid_engine.models import losses
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.engine.engine import Engine
from hybrid_engine.config.engine import DataParallelConfig, PrecisionConfig, ScheduleConfig, StageConfig


def make_engine(model: nn.Sequential, groups, *, loss=None, schedule: str = "1f1b", micro_batches: int = 4,
                virtual_stages: int = 1, lookahead: int = 0, merge_weight_grads: bool = False,
                optimizer: str | object = "sgd", lr: float = 1e-3, amp: str = "off", impl: str = "half-weights",
                loss_scale: float | None = None, scale_window: int = 2000, hysteresis: int = 1,
                clip_grad: float = 0.0, stage_impl: str = "auto", recompute: bool = False,
                dp_bucket_mb: float = 256.0, dp_grad_dtype: str = "fp32", zero: int = 0,
                overlap_param_gather: bool = True, device: str = "cpu",
                trace: bool = False, parallelize=None, layout: list[list[int]] | None = None,
                tp_chunks: int = 0, stage_compile: bool = False, shard_size: int = 0, prefetch: int = 1,
                cp_comm: str = "auto", cuda_graphs: str = "auto") -> Engine:
    """parallelize / layout: the Engine's (None: its default, parallelize_mlp and a cut by layer count)."""
    model_kwargs = {"layout": layout} | ({"parallelize": parallelize} if parallelize is not None else {})
    factory = optim.from_name(optimizer, lr) if isinstance(optimizer, str) else optimizer
    return Engine(
        model, loss if loss is not None else losses.MSE(), groups, optimizer=factory,
        schedule=ScheduleConfig(schedule, micro_batches, virtual_stages, lookahead, merge_weight_grads),
        stages=StageConfig(stage_impl, recompute, compile=stage_compile, tp_chunks=tp_chunks,
                           cuda_graphs=cuda_graphs),
        precision=PrecisionConfig(amp, impl, loss_scale, scale_window, hysteresis, clip_grad),
        data_parallel=DataParallelConfig(dp_bucket_mb, dp_grad_dtype, zero, overlap_param_gather, shard_size, prefetch),
        device=device,
        trace=trace, cp_comm=cp_comm,
        **model_kwargs)


class NonfiniteGradAt:
    """Post-backward hook: writes an inf into this rank's first gradient bucket at the chosen steps (counted from
    0 by the hook itself), as an overflowing fp16 backward would."""

    def __init__(self, steps: set[int]):
        self.steps, self.step = steps, 0

    def __call__(self, engine: Engine) -> None:
        if self.step in self.steps and engine.grads.buckets:
            engine.grads.buckets[0].view(-1)[0] = float("inf")
        self.step += 1
