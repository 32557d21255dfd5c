"""Where the converter writes, checked before anything is written, and how a written folder appears.

- Never an input: HF_DIR or CKPT is not, and does not lie inside, a folder the command reads (config/paths_apart.py);
  an export's HF_DIR is replaced whole, so nothing it reads may lie inside it either.
- Never a run's: a checkpoint directory belongs to the run that trains into it. An import holds CKPT's lock as a
  run does (checkpoint/lock.py) and writes only a directory without checkpoints or a model.toml; an export never
  writes into, or below, a directory holding checkpoints (its pruning would delete it, its `latest` would move).
- Exactly what was written: an export is written into a temporary sibling of HF_DIR and swapped in when complete,
  so HF_DIR never mixes a new export with an old one's index or shards, and a failure (a full disk, a refused
  tensor) leaves HF_DIR as it was and no partial file anywhere. With --force, an existing HF_DIR may hold only
  files an export writes: a folder holding anything else is refused, never deleted.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from typing import Iterable, Iterator

from hybrid_engine.checkpoint.files import LATEST, MANIFEST
from hybrid_engine.checkpoint.lock import in_use
from hybrid_engine.config.paths_apart import Output, clash

from .hf_config import HFError

# every name an export writes (config, weights, index, the files --like copies)
EXPORTED = re.compile(r"^(config\.json|generation_config\.json|model\.safetensors|model\.safetensors\.index\.json|"
                      r"model-\d{5}-of-\d{5}\.safetensors|tokenizer\.json|tokenizer_config\.json|"
                      r"special_tokens_map\.json|tokenizer\.model)$")


def _a_file(said: str, path: str) -> None:
    if os.path.lexists(path) and not os.path.isdir(path):
        raise HFError(f"{said} is a file, not a folder: give a folder to write into")


def _holds_checkpoints(folder: str) -> bool:
    """A --save directory (held by a run now, or `latest` beside step folders) or one checkpoint (step_N with a
    manifest)."""
    if in_use(folder) or (
            os.path.basename(folder).startswith("step_") and os.path.isfile(os.path.join(folder, MANIFEST))):
        return True
    try:
        return os.path.lexists(os.path.join(folder, LATEST)) and any(n.startswith("step_") for n in os.listdir(folder))
    except OSError:
        return False


def run_directory_above(path: str) -> str | None:
    """The nearest folder at or above `path` (real paths) that holds a run's checkpoints, or a checkpoint itself."""
    folder = os.path.realpath(os.path.abspath(path))
    while True:
        if _holds_checkpoints(folder):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def check_import_target(out: str, reads: Iterable[tuple[str, str]]) -> None:
    """CKPT of `hf import` may be written: a folder (or nothing yet), not an input nor inside one."""
    _a_file(f"CKPT {out}", out)
    problem = clash([Output(f"CKPT {out}", out)], reads)
    if problem:
        raise HFError(problem)


def check_export_target(out: str, force: bool, reads: Iterable[tuple[str, str]]) -> None:
    """HF_DIR of `hf export` may be replaced by this export (see the module's rules)."""
    said = f"HF_DIR {out}"
    _a_file(said, out)
    problem = clash([Output(said, out, replaced=True)], reads)
    if problem:
        raise HFError(problem)
    run = run_directory_above(out)
    if run is not None:
        raise HFError(f"{said} is inside {run}, a checkpoint directory of a run: the run prunes and replaces what "
                      "is there; export elsewhere")
    if not os.path.isdir(out):
        return
    held = sorted(os.listdir(out))
    foreign = [name for name in held if not EXPORTED.match(name)]
    if foreign:
        raise HFError(f"{said} holds {foreign[0]}, which an export does not write: export into a new or empty "
                      "folder (an export replaces the folder it writes)")
    if held and not force:
        raise HFError(f"{os.path.join(out, held[0])} exists: pass --force to replace it")


@contextlib.contextmanager
def replaced_folder(out: str) -> Iterator[str]:
    """A new empty folder beside `out` to write into; once the block ends without an error it becomes `out` (the
    old `out`, if any, removed), else it is removed and `out` is untouched."""
    out = os.path.normpath(out)
    parent = os.path.dirname(out) or "."
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(out)}.partial_{uuid.uuid4().hex[:8]}")
        os.mkdir(tmp)
    except OSError as exc:
        raise HFError(f"cannot create a folder beside {out} ({exc.strerror})") from None
    try:
        yield tmp
        old = os.path.join(parent, f".{os.path.basename(out)}.old_{uuid.uuid4().hex[:8]}")
        if os.path.isdir(out):
            os.rename(out, old)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
