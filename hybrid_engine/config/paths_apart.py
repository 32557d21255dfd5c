"""What a command writes is never what it reads: the one rule every entry point asks before it opens anything for
writing (a run's --metrics, --trace, --tensorboard and --save; `data prepare`'s output; `hf import` and `hf
export`'s folders).

An output clashes with an input when
- they are the same file or folder, by any name (real paths compared, symbolic links resolved; an existing file
  also by inode, so a hard link is the same file);
- the output lies inside an input folder (a metrics file inside the --load checkpoint is appended to its
  manifest; a file written into a model directory changes what a later read of that directory finds);
- the input lies inside an output folder that the command replaces as a whole (`hf export`'s HF_DIR).
A folder the command only adds new names to (--save, --tensorboard) may hold inputs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Output:
    """A path a command writes. said: how the user named it ("--metrics m.jsonl"); replaced: a folder the command
    replaces whole, so nothing it reads may lie inside it."""

    said: str
    path: str
    replaced: bool = False


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _within(inner: str, outer: str) -> bool:
    """Real path `inner` lies strictly inside real folder path `outer`."""
    return inner.startswith(outer.rstrip(os.sep) + os.sep)


def _same(a: str, b: str) -> bool:
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def clash(outputs: Iterable[Output], inputs: Iterable[tuple[str, str]]) -> str | None:
    """The line saying the first output that would overwrite or change an input ((said, path) pairs), or None."""
    inputs = [(said, path) for said, path in inputs if path]
    for out in outputs:
        if not out.path:
            continue
        written = _real(out.path)
        for said, path in inputs:
            read = _real(path)
            if _same(out.path, path):
                how = "" if os.path.normpath(out.path) == os.path.normpath(path) else " (the same file, through a link)"
                return f"{out.said} is {said}{how}: writing it would destroy what is read (give another name)"
            if os.path.isdir(read) and _within(written, read):
                return f"{out.said} is inside {said}: writing there would change what is read (give another path)"
            if out.replaced and _within(read, written):
                return f"{said} is inside {out.said}, which is replaced as a whole (give another path)"
    return None
