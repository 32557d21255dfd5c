"""One run per --save directory: rank 0 holds an flock on DIR/.lock from before the first collective to its
exit (the kernel drops it however the process ends); a second run's rank 0 fails to take it and every rank of
that run stops before training (agree_on_directory_holds)."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import stat
from typing import Iterator

from .agree import _all_gather
from .files import LOCK, CheckpointError


class DirectoryHold:
    """A run's claim on its --save directory: an flock on DIR/.lock, held by rank 0 for the run's lifetime and
    released by the kernel when the process ends, however it ends (no stale lock after a crash). One process
    per run holds it (a second flock on the file from another rank of the same run would fail like another
    run's), so the other ranks learn rank 0's outcome in agree_on_directory_holds."""

    def __init__(self, path: str, fd: int | None, error: str | None):
        self.path, self.fd, self.error = path, fd, error

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor of the open file releases the flock
            self.fd = None
        if self in _HOLDS:
            _HOLDS.remove(self)


# Process-level, not an object's: the flock must last as long as the process (the kernel drops it only at
# exit), and the driver claims the directory before the process group exists and keeps no handle, so
# agree_on_directory_holds (after init) finds rank 0's pending outcome here; kept for the process's
# lifetime: a dropped descriptor would free the lock.
_HOLDS: list[DirectoryHold] = []


def _holder_of(fd: int) -> str:
    """'pid N on HOST' as the holder wrote it into the lock file ('' if it cannot be read yet)."""
    try:
        text = os.pread(fd, 256, 0).decode("ascii", errors="replace")
    except OSError:
        return ""
    m = re.match(r"pid \d+ on [\w.-]+", text)
    return f" ({m.group(0)})" if m else ""


def hold_directory(path: str, rank: int | None = None, world_size: int | None = None,
                   said: str | None = None) -> DirectoryHold:
    """Claim --save directory `path` for this run, before the first collective: rank 0 takes an exclusive flock
    on path/.lock (without waiting) and writes 'pid N on HOST' into it; the other ranks take nothing. rank and
    world_size default to torchrun's RANK and WORLD_SIZE. On one rank a directory in use raises CheckpointError
    at once; on several, the error waits for agree_on_directory_holds (after the process group exists), which
    raises it on every rank. said: how the user named the directory (default --save PATH)."""
    said = said or f"--save {path}"
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    fd, error = None, None
    if rank == 0:
        lock = os.path.join(path, LOCK)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            fd = None
            why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            error = f"cannot hold {said}: the lock file {lock} cannot be opened ({why})"
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder_of(fd)
                os.close(fd)
                fd = None
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    error = (f"{said} is in use by another run{holder}: two runs must not share a "
                             "checkpoint directory (wait for it to end, or choose another directory)")
                else:
                    error = f"cannot hold {said}: flock on {lock} failed ({exc.strerror})"
            else:
                try:  # who holds it, for the error of a second run; the flock alone is the claim
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
                except OSError:
                    pass
    if error and world_size == 1:
        raise CheckpointError(error)
    hold = DirectoryHold(path, fd, error)
    if fd is not None or error:  # a lock to keep, or an outcome to agree on
        _HOLDS.append(hold)
    return hold


def in_use(path: str) -> bool:
    """Whether a run (or an import) holds directory `path` now: its lock file is flock'ed by a live process."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # closing drops the shared lock taken above, if it was taken
    return False


@contextlib.contextmanager
def holding_directory(path: str, said: str) -> Iterator[None]:
    """A writer of one process (hf import) holds checkpoint directory `path` as a run's rank 0 does, for as long
    as it writes: neither writes into a directory the other is using. The directory is created."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{said}: cannot create the directory ({exc.strerror})") from None
    hold = hold_directory(path, 0, 1, said)
    try:
        yield
    finally:
        hold.release()


def agree_on_directory_holds() -> None:
    """Collective (after the process group exists, before training): every rank raises rank 0's error if rank
    0 could not hold a --save directory in hold_directory. Pending errors are consumed."""
    errors = [h.error for h in _HOLDS if h.error]
    for h in [h for h in _HOLDS if h.error]:
        _HOLDS.remove(h)
    outcome = _all_gather(errors[0] if errors else None)
    first = next((e for e in outcome if e), None)
    if first:
        raise CheckpointError(first)
