"""Checkpoint files: the names the engine writes, safe reads, the manifest and its schema, finding a checkpoint
(`latest`, open_checkpoint) and checking it fits this run (check_compatible). No torch, no collectives: every
rank reads the same files and reaches the same answer on its own. See checkpoint/saving.py for the layout of a save
directory.

Nothing outside. Only names the engine writes are followed (`latest` holds step_NNNNNN; manifest shards are
rank_NNNNN.pt), each inside its directory; only regular files are read (no symbolic links, FIFOs or devices:
O_NOFOLLOW | O_NONBLOCK), `latest` up to 4 KiB and the manifest up to 64 MiB, and the manifest is checked
field by field.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass, field

from hybrid_engine.config import ConfigError

FORMAT = "hybrid_engine.checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
LOCK = ".lock"
NO_OPTIMIZER = "none"  # the manifest's optimizer of a weights-only checkpoint (checkpoint/offline.py): fits any
_STEP_DIR = re.compile(r"^step_(\d{6,})$")  # the names the engine writes, and no others
_SHARD = re.compile(r"^rank_\d{5,}\.pt$")
_LEFTOVER = re.compile(r"^\.(tmp|old)_step_\d{6,}_[0-9a-f]{8}$")
_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(ConfigError):
    """A missing, damaged, foreign or mismatched checkpoint, or a save that failed; the message is one line."""


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def shard_name(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


# ------------------------------------------------------------------------------------------------ files
# Only names of the form the engine writes are followed, each resolved inside the directory that holds it, and
# only regular files are read (never a symbolic link, FIFO or device: opened O_NOFOLLOW | O_NONBLOCK), the small
# ones with a size cap: a checkpoint directory cannot make a run read, reveal or wait on anything outside it.
MAX_POINTER_BYTES = 4096
MAX_MANIFEST_BYTES = 64 << 20
DTYPES = ("float32", "float16", "bfloat16", "float64")


def _inside(root: str, name: str) -> str:
    """root/name for a name matched against one of the patterns above: one component, so root/name is inside
    root unless it is a link, which the callers refuse (lstat / O_NOFOLLOW) instead of resolving it."""
    if os.sep in name or name in (".", "..") or os.path.isabs(name):
        raise CheckpointError(f"{name!r} is not a file name inside {root}")
    return os.path.join(root, name)


def _regular_file(path: str) -> os.stat_result | None:
    """lstat of a regular file; None when there is nothing at `path`; CheckpointError for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path} is a symbolic link: hybrid_engine writes none")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path} is not a regular file: damaged, or not written by hybrid_engine")
    return st


def _read_capped(path: str, limit: int) -> bytes:
    """The bytes of a small regular file, at most `limit` of them; never follows a link, never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"{path} is a symbolic link: hybrid_engine writes none") from None
        raise CheckpointError(f"{path} cannot be read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path} is not a regular file: damaged, or not written by hybrid_engine")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise CheckpointError(f"{path} is larger than {limit} bytes: not written by hybrid_engine")
    return b"".join(chunks)


# ------------------------------------------------------------------------------------------------ manifest
def _is_count(value, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _manifest_problem(m: dict) -> str | None:
    """What makes a manifest with the right format tag unusable (None: every field load and resume read is
    there, with the right type), so a damaged one is one clear error, never a KeyError on some rank."""
    if not _is_count(m.get("step")):
        return "'step' is not a whole number >= 0"
    grid = m.get("grid")
    if not isinstance(grid, dict):
        return "'grid' is not an object"
    for axis in ("dp", "pp", "mp", "world_size"):
        if not _is_count(grid.get(axis), 1):
            return f"'grid' has no whole number '{axis}' >= 1"
    if not isinstance(grid.get("order"), str):
        return "'grid' has no 'order' string"
    if not isinstance(m.get("model"), dict):
        return "'model' is not an object"
    if not isinstance(m.get("optimizer"), str):
        return "'optimizer' is not a string"
    files = m.get("files")
    if files is None:
        return "'files' is missing"
    if not isinstance(files, dict):
        return "'files' is not an object"
    for name, size in files.items():
        if not _SHARD.match(name):
            return f"shard name {name!r} is not of the form rank_NNNNN.pt"
        if not _is_count(size):
            return f"the size of {name} is not a whole number"
    if shard_name(0) not in files:
        return f"'files' has no {shard_name(0)}"
    sums = m.get("sha256")  # absent only in a manifest written before checksums were recorded
    if sums is not None:
        if not isinstance(sums, dict) or sorted(sums) != sorted(files):
            return "'sha256' does not name the shards of 'files'"
        if not all(isinstance(d, str) and _HEX_DIGEST.match(d) for d in sums.values()):
            return "'sha256' holds a digest that is not 64 hex digits"
    params = m.get("params")
    if not isinstance(params, dict):
        return "'params' is not an object"
    if not params:
        return "'params' is empty"
    for name, p in params.items():
        if not isinstance(p, dict):
            return f"parameter {name} is not an object"
        if not isinstance(p.get("shape"), list) or not all(_is_count(d) for d in p["shape"]):
            return f"parameter {name}: 'shape' is not a list of whole numbers"
        if p.get("dtype") not in DTYPES:
            return f"parameter {name}: dtype {p.get('dtype')!r} is not one of {', '.join(DTYPES)}"
        if not isinstance(p.get("file"), str) or not _SHARD.match(p["file"]):
            return f"parameter {name}: shard name {p.get('file')!r} is not of the form rank_NNNNN.pt"
        if p["file"] not in files:
            return f"parameter {name}: its shard {p['file']} is not among 'files'"
    return None


def read_manifest(path: str) -> dict:
    """The manifest of checkpoint directory `path`, read with a size cap and checked field by field."""
    manifest_file = _inside(path, MANIFEST)
    if _regular_file(manifest_file) is None:
        raise CheckpointError(f"{path} is not a hybrid_engine checkpoint: it has no {MANIFEST}")
    raw = _read_capped(manifest_file, MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{manifest_file} cannot be read as JSON ({exc}): damaged, or not a hybrid_engine "
                              "checkpoint") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        tag = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{path} is not a hybrid_engine checkpoint: format {tag!r}, expected {FORMAT!r}")
    problem = _manifest_problem(manifest)
    if problem:
        raise CheckpointError(f"{manifest_file} is malformed ({problem}): damaged, or not written by hybrid_engine")
    return manifest


def _complete(root: str, name: str) -> bool:
    """Whether root/name is a checkpoint this engine wrote and finished (its manifest is written last)."""
    try:
        read_manifest(os.path.join(root, name))
        return True
    except CheckpointError:
        return False


# ------------------------------------------------------------------------------------------------ finding
@dataclass
class Checkpoint:
    path: str
    manifest: dict
    notes: list[str] = field(default_factory=list)
    """What a run starting from it should say (e.g. that it was trained on other data)."""

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def checksums(self) -> dict[str, str] | None:
        """{shard name: SHA-256}; None for a checkpoint written before checksums were recorded."""
        return self.manifest.get("sha256")


def _step_dirs(root: str) -> list[tuple[int, str]]:
    """(step, name) of every real directory (not a link) in root named like a checkpoint, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        try:
            if m and stat.S_ISDIR(os.lstat(os.path.join(root, name)).st_mode):
                found.append((int(m.group(1)), name))
        except FileNotFoundError:
            continue
    return sorted(found)


def latest_path(root: str) -> str | None:
    """The newest complete checkpoint under a --save directory, or None when it holds none."""
    pointer = os.path.join(root, LATEST)
    if os.path.lexists(pointer):
        name = _read_capped(pointer, MAX_POINTER_BYTES).decode("ascii", errors="replace").strip()
        if not _STEP_DIR.match(name):  # the content is not echoed: it need not be ours to show
            raise CheckpointError(f"{pointer} does not hold a checkpoint name (step_NNNNNN): damaged, or not "
                                  "written by hybrid_engine")
        path = _inside(root, name)
        if not os.path.lexists(path):
            raise CheckpointError(f"{pointer} names {name!r}, which does not exist in {root}")
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            kind = "a symbolic link" if os.path.islink(path) else "a file"
            raise CheckpointError(f"{path} is {kind}, not a checkpoint directory: hybrid_engine writes none")
        return path
    # No pointer (e.g. a crash between the first rename and the first pointer write): the newest complete one.
    for _, name in reversed(_step_dirs(root)):
        if _complete(root, name):
            return os.path.join(root, name)
    return None


def pointed_to(root: str) -> str | None:
    """root/<the name in root/latest>, or None when there is no readable pointer; never raises, never blocks, never
    falls back to the newest step_N (for a report made while a run is being stopped)."""
    try:
        name = _read_capped(os.path.join(root, LATEST), MAX_POINTER_BYTES).decode("ascii", errors="replace").strip()
    except CheckpointError:
        return None
    return os.path.join(root, name) if _STEP_DIR.match(name) else None


def open_checkpoint(path: str) -> Checkpoint:
    """A checkpoint directory (DIR/step_N) or a --save directory (its latest), with its manifest checked:
    format tag, fields, and every shard a regular file inside it with the size the manifest records (a
    truncated shard is caught here)."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}: no such file or directory")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} is a file, not a hybrid_engine checkpoint directory "
                              "(give DIR/step_N or a --save DIR)")
    if not os.path.lexists(os.path.join(path, MANIFEST)):
        newest = latest_path(path)
        if newest is None:
            raise CheckpointError(f"{path} is not a hybrid_engine checkpoint: it has no {MANIFEST}, "
                                  f"no '{LATEST}' and no step_N directory")
        path = newest
    manifest = read_manifest(path)
    for name, size in manifest["files"].items():
        file = _inside(path, name)
        st = _regular_file(file)
        if st is None:
            raise CheckpointError(f"checkpoint shard {file} is missing")
        if st.st_size != size:
            raise CheckpointError(f"checkpoint shard {file} is truncated or damaged: {st.st_size} bytes, "
                                  f"the manifest says {size}")
    return Checkpoint(path, manifest)


def check_compatible(ckpt: Checkpoint, model: dict, shapes: dict[str, tuple[int, ...]], optimizer: str) -> None:
    """This run's model (config and parameter shapes) and optimizer must be the ones the checkpoint holds."""
    saved = ckpt.manifest["model"]
    keys = [k for k in model if k != "seed"]
    if any(saved.get(k) != model[k] for k in keys):
        def describe(m: dict) -> str:
            return ", ".join(f"{k} {m.get(k)}" for k in keys)

        raise CheckpointError(f"checkpoint {ckpt.path} holds a model of {describe(saved)}; this run builds "
                              f"{describe(model)}: pass the same model flags, or start without a checkpoint")
    saved_shapes = {k: tuple(v["shape"]) for k, v in ckpt.manifest["params"].items()}
    if saved_shapes != shapes:
        odd = sorted(set(saved_shapes) ^ set(shapes)) or [k for k in shapes if saved_shapes[k] != shapes[k]]
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit this model: parameter {odd[0]} is "
                              f"{saved_shapes.get(odd[0])} there, {shapes.get(odd[0])} here")
    if ckpt.manifest["optimizer"] not in (optimizer, NO_OPTIMIZER):
        raise CheckpointError(f"checkpoint {ckpt.path} was saved with --optimizer {ckpt.manifest['optimizer']}; "
                              f"this run uses {optimizer}")


def check_same_data(ckpt: Checkpoint, model: dict, data: dict | None, continuing: bool) -> str | None:
    """The checkpoint must have been trained on this run's data: the same seed (the order of the batches; for the
    MLP also the regression target) and, for the GPT, the same data (its fingerprint). A run that continues the
    checkpoint's own run (--resume) is refused otherwise; one that starts from it (--load) is told (the note
    returned), since training on other data from a trained model is a thing users do on purpose."""
    saved_seed, seed = ckpt.manifest["model"].get("seed"), model.get("seed")
    saved_data = ckpt.manifest.get("data")
    problems = []
    if saved_seed is not None and saved_seed != seed:
        target = ", the MLP's regression target" if model.get("name") == "large_linear_model" else ""
        problems.append((f"was trained with --seed {saved_seed}; this run has --seed {seed} (other batches{target})",
                         f"pass --seed {saved_seed}"))
    if isinstance(saved_data, dict) and data is not None and saved_data.get("fingerprint") != data["fingerprint"]:
        problems.append((f"was trained on {saved_data.get('name')} ({saved_data.get('tokens')} tokens); this run's "
                         f"data {data['name']} ({data['tokens']} tokens) is other data", "pass the same --data"))
    if not problems:
        return None
    what = "; it ".join(p for p, _ in problems)
    if continuing:
        raise CheckpointError(f"checkpoint {ckpt.path} {what}: --resume continues a run on the data it was trained "
                              f"on ({' and '.join(f for _, f in problems)}), or start a new --save directory from "
                              "it with --load")
    return f"note: checkpoint {ckpt.path} {what}: training goes on from its weights on this run's data"
