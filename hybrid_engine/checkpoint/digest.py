"""Checksums of checkpoint shards: a SHA-256 per file, computed while the shard is written (the bytes pass through
the hash on their way to the file, so nothing is read back) and checked before every read.

A shard damaged in place (a flipped bit on disk, a bad copy) keeps its size and usually still parses as a zip
that torch.load accepts, so neither the size the manifest records nor torch notices; the weights would load
wrong and be saved again as the next checkpoint. The manifest's "sha256" entry ({shard name: hex digest}) is
what catches it. A manifest written before checksums were recorded has no such entry: its shards are checked by
size only, and whoever loads it says so (Checkpoint.checksums is None).
"""
from __future__ import annotations

import hashlib
import os
import stat
import time

from .files import CheckpointError, _step_dirs, open_checkpoint

ALGORITHM = "sha256"
_CHUNK = 4 << 20


class OutOfTime(Exception):
    """A bounded search ran past its deadline (not an OSError: nothing failed to read)."""


class HashingWriter:
    """A binary file that hashes every byte written through it (torch.save needs only write and flush)."""

    def __init__(self, file):
        self.file, self.hash, self.size = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += memoryview(data).nbytes
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def file_digest(path: str, deadline: float | None = None) -> str:
    """SHA-256 of a regular file (never through a link, never blocking on a FIFO); CheckpointError otherwise, and
    OutOfTime once time.monotonic() passes `deadline` (None: no limit)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CheckpointError(f"checkpoint shard {path} cannot be read ({exc.strerror})") from None
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path} is not a regular file: damaged, or not written by hybrid_engine")
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
            if deadline is not None and time.monotonic() > deadline:
                raise OutOfTime(path)
    except OSError as exc:
        raise CheckpointError(f"checkpoint shard {path} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    return digest.hexdigest()


def verify(path: str, expected: str | None, deadline: float | None = None) -> None:
    """Raise the one-line CheckpointError when the file's SHA-256 is not `expected` (None: nothing recorded)."""
    if expected is not None and file_digest(path, deadline) != expected:
        raise CheckpointError(f"checkpoint shard {path} cannot be read (its SHA-256 is not the one its manifest "
                              "records): damaged since it was written")


def intact(path: str, deadline: float | None = None) -> bool:
    """Whether the checkpoint directory `path` has a valid manifest with checksums and every shard matches
    (OutOfTime once `deadline` passes)."""
    try:
        ckpt = open_checkpoint(path)
        if ckpt.checksums is None:
            return False  # cannot be shown intact
        for name, digest in ckpt.checksums.items():
            verify(os.path.join(ckpt.path, name), digest, deadline)
        return True
    except CheckpointError:
        return False


def _older(path: str, step: int) -> list[str]:
    """The checkpoint directories beside `path` (its --save directory) of steps before `step`, newest first."""
    root = os.path.dirname(os.path.normpath(path))
    return [os.path.join(root, name) for older, name in reversed(_step_dirs(root)) if older < step]


def newest_intact_before(path: str, step: int, deadline: float | None = None) -> str | None:
    """The newest checkpoint beside `path` of a step before `step` whose every shard matches its checksum; None
    when there is none (OutOfTime once `deadline` passes: hashing large checkpoints takes time)."""
    return next((older for older in _older(path, step) if intact(older, deadline)), None)


def newest_complete_before(path: str, step: int) -> str | None:
    """The newest checkpoint beside `path` of a step before `step` with a valid manifest and shards of the sizes
    it records (checked without hashing)."""
    for older in _older(path, step):
        try:
            open_checkpoint(older)
            return older
        except CheckpointError:
            continue
    return None
