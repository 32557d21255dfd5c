"""What a plan runs inside: the grid and the run's choices that the planner leaves alone."""
from __future__ import annotations

from dataclasses import dataclass

from hybrid_engine.models import registry


@dataclass(frozen=True)
class Setting:
    """The grid, the batch and the precision, optimizer and recompute of a run: fixed while plans are weighed."""

    dp: int
    pp: int
    mp: int
    batch_size: int
    half: bool = True
    optimizer: str = "sgd"
    zero: int = 0
    grad_wire_bytes: int = 4
    full_recompute: bool = False
    clip: bool = False

    @property
    def per_dp(self) -> int:
        return self.batch_size // self.dp

    @property
    def elem(self) -> int:
        """Bytes of one activation element."""
        return 2 if self.half else 4

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.mp

    @staticmethod
    def of(cfg, dp: int, pp: int, mp: int) -> "Setting":
        """The setting of a run (cfg: RunConfig) on a dp x pp x mp grid."""
        clip = cfg.precision.clip_grad
        clip = clip if clip is not None else registry.entry(cfg.model.name).clip_grad
        return Setting(dp, pp, mp, cfg.data.batch_size, cfg.precision.amp != "off", cfg.optimizer.name or "sgd",
                       cfg.data_parallel.zero, 2 if cfg.data_parallel.grad_dtype == "bf16" else 4,
                       cfg.stages.recompute == "full", bool(clip))
