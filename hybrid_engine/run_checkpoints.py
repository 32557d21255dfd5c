"""A run's checkpoints, seen from the training loop: which one it starts from, and what it says when that one
cannot be read.

    start_from = checkpoint_to_start_from(cfg, workload, restarted)    # every rank, before any collective
    first_step = RunCheckpoints(cfg, engine, state, progress).start(start_from)      # collective

Which checkpoint: `--load PATH` starts from PATH; `--resume` continues from `--save DIR`'s latest when there is
one. Both together: a PATH inside DIR is the user naming the checkpoint to continue from (an older one, when
latest is damaged), so it wins, and latest is pointed back at it once it has loaded; on a launcher's restart
(torchrun --max-restarts) latest wins again, since it then holds where this run had got to. A PATH elsewhere is
where a run starts the first time; once DIR holds checkpoints, latest wins.

A checkpoint that cannot be read (a shard whose checksum does not match, a tensor of the wrong shape, ...) stops
every rank with the reason, the newest intact older checkpoint in the same directory, and the flags that
continue from it.
"""
from __future__ import annotations

import os

from . import checkpoint
from .checkpoint import CheckpointError
from .config import ConfigError, RunConfig


def _inside(path: str, directory: str) -> bool:
    """Whether checkpoint directory `path` sits directly in `directory` (DIR/step_N of this --save DIR)."""
    parent = os.path.dirname(os.path.abspath(os.path.normpath(path)))
    return os.path.realpath(parent) == os.path.realpath(directory)


def checkpoint_to_start_from(cfg: RunConfig, workload, restarted: bool = False) -> checkpoint.Checkpoint | None:
    """The checkpoint this run continues (None: from scratch), checked on every rank before any collective.
    `restarted`: this is a launcher's restart of the run (torchrun's TORCHELASTIC_RESTART_COUNT > 0)."""
    c = cfg.checkpoint
    existing = None
    if c.save:
        checkpoint.hold_directory(c.save)  # one run per directory: a second one stops before training (exit 2)
        existing = checkpoint.latest_path(c.save)
        if existing and not c.resume:
            raise ConfigError(f"--save {c.save} already holds checkpoints (latest {existing}); pass --resume "
                              "to continue from it, or choose another directory")
    chosen = c.load is not None and c.save is not None and _inside(c.load, c.save) and not restarted
    path = existing if (c.resume and existing and not chosen) else c.load
    if path is None:
        return None
    ckpt = checkpoint.open_checkpoint(path)
    checkpoint.check_compatible(ckpt, workload.checkpoint_model, workload.param_shapes(), cfg.optimizer.name)
    return ckpt


class RunCheckpoints:
    """The training loop's side of checkpoints (every rank holds one; each method is collective)."""

    def __init__(self, cfg: RunConfig, engine, state, progress, rank: int):
        self.cfg, self.engine, self.state, self.progress, self.rank = cfg, engine, state, progress, rank

    def continue_from(self, path: str) -> str:
        """The flags that continue a run from checkpoint `path`."""
        save = self.cfg.checkpoint.save
        if save and _inside(path, save):
            return f"--resume --load {path}"
        return f"--load {path}"

    def start(self, ckpt: checkpoint.Checkpoint | None) -> int:
        """Load `ckpt` into the engine (collective); the step to continue from (0 without a checkpoint)."""
        self.state.last_checkpoint = ckpt.path if ckpt else None
        if ckpt is None:
            return 0
        try:
            step = checkpoint.load(self.engine, ckpt)
        except CheckpointError as exc:  # every rank is here: load agreed on the error
            older = checkpoint.newest_intact_before(ckpt.path, ckpt.step) if self.rank == 0 else None
            older = checkpoint._from_rank0(older)
            where = os.path.dirname(os.path.normpath(ckpt.path))
            advice = (f"the newest intact older checkpoint is {older}: continue from it with "
                      f"{self.continue_from(older)}" if older else f"no older checkpoint in {where} is intact")
            raise CheckpointError(f"{exc}; {advice}") from None
        if ckpt.checksums is None:
            self.progress.say(f"note: {ckpt.path} records no checksums (written before hybrid_engine recorded them): "
                              "its shards were checked by size only")
        save = self.cfg.checkpoint.save
        if save and _inside(ckpt.path, save):
            latest = checkpoint._from_rank0(checkpoint.latest_path(save) if self.rank == 0 else None)
            if latest not in (None, ckpt.path):
                checkpoint.rewind_latest(save, ckpt)
                self.progress.say(f"{os.path.join(save, checkpoint.LATEST)} now names {os.path.basename(ckpt.path)} "
                                  f"(--load); {os.path.basename(latest)} stays until this run saves that "
                                  "step again")
        self.progress.say(f"resumed from {ckpt.path} at step {step}")
        return step
