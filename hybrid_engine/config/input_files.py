"""Reading a file a user names (a --config TOML, a tokenizer): only a regular file, never through a wait.

open() of a FIFO blocks until some process opens its other end, which may be never; a device or /proc file can
be endless. So a user's input is opened with O_NONBLOCK, checked to be a regular file with fstat, and read with
a size cap; anything else is one ConfigError line naming the file (checkpoints have their own, stricter reader in
checkpoint/files.py).
"""
from __future__ import annotations

import os
import stat

from .engine import ConfigError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    """'a FIFO', 'a directory', ... for a stat mode that is not a regular file's."""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def read_regular_file(path: str, limit: int, said: str, unreadable: str = "{said}: cannot read it ({why})") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them; ConfigError (naming it as `said`) otherwise. A file
    that cannot be opened is said with the `unreadable` template."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(unreadable.format(said=said, why=exc.strerror)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{said} is {kind_of(mode)}, not a regular file")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(unreadable.format(said=said, why=exc.strerror)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(f"{said} is larger than {limit} bytes: not a file of this kind")
    return b"".join(chunks)
