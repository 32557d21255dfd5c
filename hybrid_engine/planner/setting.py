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
    cp: int = 1
    """Context-parallel ranks, each holding 1/cp of every sequence: the model's shape is already one rank's share
    (context.py per_context_rank); the K/V transfers between them are the cp ranks' (context_comm.py)."""
    cp_comm: str = "auto"
    """--cp-comm: the K/V transfer variant, or auto (context_comm.choose_comm)."""
    zero_shard: int = 0
    """ZeRO's shard group (--zero-shard-size): ranks that split what the level shards; 0: every DP x CP rank."""
    bucket_bytes: float = 256 * 2**20
    cuda_graphs: str = "off"
    """--cuda-graphs: on, the stages replay as CUDA graphs wherever the plan allows it; auto, where that is also
    predicted faster (and, choose.predict, fits); off, never (step_time.step_time)."""
    selective_recompute: bool = False
    """The decoders' selective recompute (the attention core rerun in the backward): what the model does, not the
    engine, so its cost is the model's; it keeps the stages from replaying as CUDA graphs."""
    trace: bool = False
    """--trace: the run times every tensor-parallel collective as it launches, so its stages never replay as CUDA
    graphs."""
    cp_kernel: str = "auto"
    """--cp-kernel: the kernel of the attention blocks, or auto (the card's SDPA kernel: Card.blocks_kernel)."""
    sequence_parallel: bool = False
    """--sequence-parallel: a decoder's MP collectives are all-gathers and reduce-scatters along the sequence, and
    its norms and row-parallel biases see a sequence chunk (step_time.sequence_parallel_s)."""

    @property
    def replicas(self) -> int:
        """The ranks holding the same weights, whose gradients are summed: dp x cp."""
        return self.dp * self.cp

    @property
    def shard_size(self) -> int:
        return self.zero_shard or self.replicas

    @property
    def per_dp(self) -> int:
        return self.batch_size // self.dp

    @property
    def elem(self) -> int:
        """Bytes of one activation element."""
        return 2 if self.half else 4

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.mp * self.cp

    @staticmethod
    def of(cfg, dp: int, pp: int, mp: int) -> "Setting":
        """The setting of a run (cfg: RunConfig) on a dp x pp x mp grid and its --cp."""
        clip = cfg.precision.clip_grad
        clip = clip if clip is not None else registry.entry(cfg.model.name).clip_grad
        d = cfg.data_parallel
        return Setting(dp, pp, mp, cfg.data.batch_size, cfg.precision.amp != "off", cfg.optimizer.name or "sgd",
                       d.zero, 2 if d.grad_dtype == "bf16" else 4, cfg.stages.recompute == "full", bool(clip),
                       cfg.parallel.cp, cfg.parallel.cp_comm, d.shard_size, d.bucket_mb * 2**20,
                       cfg.stages.cuda_graphs, cfg.stages.recompute == "selective", cfg.reporting.trace is not None,
                       cfg.parallel.cp_kernel, getattr(cfg.model.options, "sequence_parallel", False))
