"""A run's checkpoints, seen from the training loop: which one it starts from, when it writes one, when a
written one becomes `latest`, and what to say when training or loading stops.

    start_from = checkpoint_to_start_from(cfg, workload, restarted, settings)  # every rank, before any collective
    ckpts = RunCheckpoints(cfg, engine, workload, state, progress, rank, settings=settings)
    first_step = ckpts.start(start_from)                                     # collective, as are the rest
    ...  step N's loss passed the divergence guard:  ckpts.publish_written()  (the checkpoint of state N)
    ...  after step N:                               ckpts.maybe_write(N + 1)
    ...  a loss stopped training:                    ckpts.discard_written(); ckpts.where_to_continue()

A checkpoint of state N is written after step N - 1 and published (renamed into place, named by `latest`) only
once step N, which trains on that state, has a finite loss that is no spike (hybrid_engine/train/divergence.py).

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
import time

from . import digest, files, loading, lock, saving, update_settings
from .agree import _from_rank0
from .files import CheckpointError
from hybrid_engine.config.checkpoint_model import model_toml
from hybrid_engine.config.run import ConfigError, RunConfig


def _inside(path: str, directory: str) -> bool:
    """Whether checkpoint directory `path` sits directly in `directory` (DIR/step_N of this --save DIR)."""
    parent = os.path.dirname(os.path.abspath(os.path.normpath(path)))
    return os.path.realpath(parent) == os.path.realpath(directory)


def checkpoint_to_start_from(cfg: RunConfig, workload, restarted: bool = False,
                             settings: dict | None = None) -> files.Checkpoint | None:
    """The checkpoint this run continues (None: from scratch), checked on every rank before any collective.
    `restarted`: this is a launcher's restart of the run (torchrun's TORCHELASTIC_RESTART_COUNT > 0).
    settings: this run's update settings (checkpoint/update_settings.py), each said beside the checkpoint's if they
    differ."""
    c = cfg.checkpoint
    existing = None
    if c.save:
        lock.hold_directory(c.save)  # one run per directory: a second one stops before training (exit 2)
        existing = files.latest_path(c.save)
        if existing and not c.resume:
            raise ConfigError(f"--save {c.save} already holds checkpoints (latest {existing}); pass --resume "
                              "to continue from it, or choose another directory")
    chosen = c.load is not None and c.save is not None and _inside(c.load, c.save) and not restarted
    path = existing if (c.resume and existing and not chosen) else c.load
    if path is None:
        return None
    ckpt = files.open_checkpoint(path)
    files.check_compatible(ckpt, workload.checkpoint_model, workload.param_shapes(), cfg.optimizer.name)
    continuing = c.resume and c.save is not None and _inside(ckpt.path, c.save)
    note = files.check_same_data(ckpt, workload.checkpoint_model, workload.checkpoint_data, continuing)
    if note:
        ckpt.notes.append(note)
    ckpt.notes.extend(update_settings.changes(ckpt.manifest, settings or {}, ckpt.path, ckpt.step))
    return ckpt


class RunCheckpoints:
    """The training loop's side of checkpoints (every rank holds one; each method is collective)."""

    def __init__(self, cfg: RunConfig, engine, workload, state, progress, rank: int, faults=None,
                 settings: dict | None = None):
        self.cfg, self.engine, self.workload, self.state = cfg, engine, workload, state
        self.settings = settings or {}  # the update's settings (train/update_settings.py), recorded in manifests
        self.progress, self.rank, self.faults = progress, rank, faults
        self.written: saving.Written | None = None  # on disk, waiting for its step's loss

    def continue_from(self, path: str) -> str:
        """The flags that continue a run from checkpoint `path`."""
        save = self.cfg.checkpoint.save
        if save and _inside(path, save):
            return f"--resume --load {path}"
        return f"--load {path}"

    def start(self, ckpt: files.Checkpoint | None) -> int:
        """Load `ckpt` into the engine (collective); the step to continue from (0 without a checkpoint)."""
        self.state.last_checkpoint = ckpt.path if ckpt else None
        if ckpt is None:
            return 0
        try:
            step = loading.load(self.engine, ckpt)
        except CheckpointError as exc:  # every rank is here: load agreed on the error
            advice = _from_rank0(self._older_advice(ckpt) if self.rank == 0 else None)
            raise CheckpointError(f"{exc}; {advice}") from None
        for note in ckpt.notes:
            self.progress.say(note)
        if ckpt.checksums is None:
            self.progress.say(f"note: {ckpt.path} records no checksums (written before hybrid_engine recorded them): "
                              "its shards were checked by size only")
        save = self.cfg.checkpoint.save
        if save and _inside(ckpt.path, save):
            latest = _from_rank0(files.latest_path(save) if self.rank == 0 else None)
            if latest is not None and os.path.realpath(latest) != os.path.realpath(ckpt.path):
                saving.rewind_latest(save, ckpt)
                self.progress.say(f"{os.path.join(save, files.LATEST)} now names {os.path.basename(ckpt.path)} "
                                  f"(--load); {os.path.basename(latest)} stays until this run saves that "
                                  "step again")
        continuing = self.cfg.checkpoint.resume and save and _inside(ckpt.path, save)
        self.progress.say(f"{'resumed' if continuing else 'started'} from {ckpt.path} at {'' if continuing else 'its '}"
                          f"step {step}")
        return step

    def _older_advice(self, ckpt: files.Checkpoint) -> str:
        """Which older checkpoint of the same directory to continue from, and how (rank 0, while the others wait
        in a collective: the hashing stops at half the --comm-timeout, after which the newest complete one is
        named, its checksums to be checked when it loads)."""
        deadline = time.monotonic() + self.cfg.parallel.comm_timeout / 2
        try:
            older = digest.newest_intact_before(ckpt.path, ckpt.step, deadline)
            what = "the newest intact older checkpoint"
        except digest.OutOfTime:
            older = digest.newest_complete_before(ckpt.path, ckpt.step)
            what = "the newest complete older checkpoint (its checksums are checked when it loads)"
        if older is None:
            return f"no older checkpoint in {os.path.dirname(os.path.normpath(ckpt.path))} is intact"
        return f"{what} is {older}: continue from it with {self.continue_from(older)}"

    def maybe_write(self, done: int) -> None:
        """After `done` steps: write the checkpoint of that state if it is the last step or a multiple of
        save_every (published later, by publish_written)."""
        c = self.cfg.checkpoint
        if not c.save or not (done == self.cfg.training.steps or (c.save_every and done % c.save_every == 0)):
            return
        crash = self.faults is not None and self.faults.crashes_in_save(done, self.rank)
        self.written = saving.write(self.engine, c.save, done, self.run_info(), crash_in_save=crash)

    def run_info(self) -> dict:
        """What the manifest records besides the state: the model, the optimizer, the update's settings (the lr
        schedule, whose position is the step; betas, weight decay, clipping), and the data (the token models)."""
        info = {"model": self.workload.checkpoint_model, "optimizer": self.cfg.optimizer.name}
        if self.workload.checkpoint_data is not None:
            info["data"] = self.workload.checkpoint_data
        info.update(self.settings)
        return info

    def publish_written(self) -> None:
        """The written checkpoint's state has trained one step with a finite loss and no spike: make it latest."""
        if self.written is None:
            return
        written, self.written = self.written, None
        path = saving.publish(written, keep=self.cfg.checkpoint.keep, model_toml=model_toml(self.cfg))
        self.state.last_checkpoint = path
        self.progress.say(f"saved {path}", verbose=True)

    def discard_written(self) -> None:
        """The written checkpoint's state diverged: it is never published."""
        if self.written is not None:
            saving.discard(self.written)
            self.written = None

    def where_to_continue(self) -> str:
        """After a loss stopped training: how to go on from the last checkpoint that trained on."""
        last, save = self.state.last_checkpoint, self.cfg.checkpoint.save
        if last is None:
            return (f"nothing was published to --save {save}: start again with a lower --lr" if save
                    else "start again with a lower --lr")
        flags = "--resume" if save and _inside(last, save) and self._is_latest(last) else self.continue_from(last)
        return (f"{flags} with a lower --lr continues from {last}, the last checkpoint that trained on with a "
                "finite loss and no spike")

    def _is_latest(self, path: str) -> bool:
        try:
            latest = files.latest_path(self.cfg.checkpoint.save)
        except CheckpointError:
            return False
        return latest is not None and os.path.realpath(latest) == os.path.realpath(path)
