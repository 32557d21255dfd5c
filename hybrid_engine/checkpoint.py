"""Checkpoints: saved on one grid, loaded on any grid; a crash never leaves a half-written one behind.

Layout of a save directory (it must be visible to every rank: one filesystem, or a shared one across nodes):

    DIR/latest                  the name of the newest complete checkpoint ("step_000010"), replaced atomically
    DIR/step_000010/
        manifest.json           format tag, step, grid, schedule, model config, optimizer, every parameter's
                                full shape and the shard holding it, every shard's size in bytes
        rank_00000.pt ...       one shard per rank (torch.save, loaded with weights_only=True)
    DIR/.tmp_step_000012_<id>/  a save in progress (or one a crash interrupted: ignored, removed by the next save)
    DIR/.lock                   flock'ed by rank 0 of the run that saves here, for its lifetime (hold_directory)

"step" counts completed optimizer steps: step_000010 resumes at step index 10, and because the batch of a step
depends only on (seed, step), a resumed run sees exactly the batches the uninterrupted run would have seen.

Grid independence. The model and optimizer state are stored whole, not as this grid's shards: the rank of each
pipeline stage with dp = 0 and mp = 0 writes that stage's weights and per-parameter optimizer state (momentum,
Adam's exp_avg / exp_avg_sq / step) gathered over MP, keyed by the dense model's parameter names
("<module index>.<weight|bias>", Engine.state_for_checkpoint). A run on any other grid reads the tensors of its
own stages and slices them for its MP rank (Engine.load_checkpoint_state), so dp2 x pp2 x mp2 -> dp1 x pp4 x mp2
-> one rank continues the same loss curve. Every rank's shard also holds its RNG state (restored only on the
same grid, where it means the same thing) and the fp16 loss scaler's state (the same on every rank).

Atomic save. Every rank writes its shard into a fresh temporary directory and fsyncs it; the ranks agree that
all shards are complete (one all_gather); only then rank 0 writes the manifest, renames the directory into
place, and replaces `latest` (write a temporary file, fsync, os.replace). A crash at any point leaves `latest`
on the previous complete checkpoint. Then all but the newest `keep` complete checkpoints (a step_N directory
with a valid manifest: nothing else is counted or removed) and leftovers of interrupted saves are removed; the
checkpoint just written is never removed. Nothing is published when any rank's weights or optimizer state are
not finite, or any rank cannot write its shard: the temporary directory is removed and every rank raises the
same error, naming the cause (the OS error behind torch's), with `latest` untouched.

One run per directory. Rank 0 holds an flock on DIR/.lock from before the first collective to its exit (the
kernel drops it however the process ends); a second run's rank 0 fails to take it and every rank of that run
stops before training (agree_on_directory_holds).

Nothing outside. Only names the engine writes are followed (`latest` holds step_NNNNNN; manifest shards are
rank_NNNNN.pt), each inside its directory; only regular files are read (no symbolic links, FIFOs or devices:
O_NOFOLLOW | O_NONBLOCK), `latest` up to 4 KiB and the manifest up to 64 MiB, and the manifest is checked
field by field. Every tensor read must have the shape and dtype the manifest records.

Agreement. Loading is checked on every rank before any collective (`open_checkpoint`, `check_compatible`:
manifest, format, fields, shapes, shard sizes; the same files give every rank the same answer), and reading the shards
ends with one all_gather of the outcome, so a bad checkpoint stops every rank with the same CheckpointError,
never leaves some ranks waiting in a collective.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ConfigError

FORMAT = "hybrid_engine.checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
LOCK = ".lock"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")  # the names the engine writes, and no others
_SHARD = re.compile(r"^rank_\d{5,}\.pt$")
_LEFTOVER = re.compile(r"^\.(tmp|old)_step_\d{6,}_[0-9a-f]{8}$")


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

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


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
    if ckpt.manifest["optimizer"] != optimizer:
        raise CheckpointError(f"checkpoint {ckpt.path} was saved with --optimizer {ckpt.manifest['optimizer']}; "
                              f"this run uses {optimizer}")


# ------------------------------------------------------------------------------------------------ collectives
def _world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather(obj) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _from_rank0(obj):
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        obj = box[0]
    return obj


def _raise_first(errors: list[str | None]) -> None:
    for rank, err in enumerate(errors):
        if err is not None:
            raise CheckpointError(err if len(errors) == 1 else f"{err} (rank {rank})")


def _agree(error: str | None) -> None:
    """Collective: raise the first failing rank's error on every rank, so all leave together or none does."""
    _raise_first(_all_gather(error))


# ------------------------------------------------------------------------------------------------ holding
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


_HOLDS: list[DirectoryHold] = []  # kept for the process's lifetime: a dropped descriptor would free the lock


def _holder_of(fd: int) -> str:
    """'pid N on HOST' as the holder wrote it into the lock file ('' if it cannot be read yet)."""
    try:
        text = os.pread(fd, 256, 0).decode("ascii", errors="replace")
    except OSError:
        return ""
    m = re.match(r"pid \d+ on [\w.-]+", text)
    return f" ({m.group(0)})" if m else ""


def hold_directory(path: str, rank: int | None = None, world_size: int | None = None) -> DirectoryHold:
    """Claim --save directory `path` for this run, before the first collective: rank 0 takes an exclusive flock
    on path/.lock (without waiting) and writes 'pid N on HOST' into it; the other ranks take nothing. rank and
    world_size default to torchrun's RANK and WORLD_SIZE. On one rank a directory in use raises CheckpointError
    at once; on several, the error waits for agree_on_directory_holds (after the process group exists), which
    raises it on every rank."""
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
            error = f"cannot hold --save {path}: the lock file {lock} cannot be opened ({why})"
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder_of(fd)
                os.close(fd)
                fd = None
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    error = (f"--save {path} is in use by another run{holder}: two runs must not share a "
                             "checkpoint directory (wait for it to end, or choose another directory)")
                else:
                    error = f"cannot hold --save {path}: flock on {lock} failed ({exc.strerror})"
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


# ------------------------------------------------------------------------------------------------ saving
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _write_shard(path: str, shard: dict, crash: bool) -> int:
    with open(path, "wb") as f:
        if crash:  # test hook: half a shard reaches the disk, then the process dies (see hybrid_engine.faults)
            import io
            import signal

            buffer = io.BytesIO()
            torch.save(shard, buffer)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save(shard, f)
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path)


def _non_finite(shard: dict) -> str | None:
    """What in a shard's weights or optimizer state is not finite (None: all of it is); one pass of isfinite."""
    for name, tensor in shard["weights"].items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"the weights are not finite ({name}"
    for name, state in shard["optimizer"].items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"the optimizer state is not finite ({name} {key}"
    return None


def _cause(exc: BaseException) -> str:
    """The cause of a failed write in words: the OS error behind it where there is one (torch's zip writer
    reports a full disk as a RuntimeError whose context is the OSError), else the exception's first line."""
    seen, link = [], exc
    while link is not None and link not in seen:
        seen.append(link)
        link = link.__cause__ or link.__context__
    for link in seen:
        if isinstance(link, OSError) and link.strerror:
            return link.strerror
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _still_latest(root: str) -> str:
    try:
        previous = latest_path(root)
    except CheckpointError:
        previous = None
    if previous is None:
        return f"{root} holds no earlier checkpoint"
    return f"{os.path.join(root, LATEST)} still names {os.path.basename(previous)}"


def save(engine, root: str, step: int, run_info: dict, keep: int = 3, crash_in_save: bool = False) -> str:
    """Collective over the world: write the checkpoint of `step` completed steps under `root`, atomically;
    keep the newest `keep`. run_info: {"model": {...}, "optimizer": name} (recorded in the manifest).
    Nothing is published (and nothing pruned) unless every rank's state is finite and on disk; otherwise the
    temporary directory is removed and every rank raises the same CheckpointError."""
    rank, world = _world()
    state = engine.state_for_checkpoint()  # MP all-gathers: every rank, same order
    coords = engine.groups.coords
    owner = coords.dp == 0 and coords.mp == 0
    shard = {"format": FORMAT, "step": step, "rank": rank, "rng": _rng_state(engine.device),
             "scaler": state["scaler"], "weights": state["weights"] if owner else {},
             "optimizer": state["optimizer"] if owner else {}}
    tmp_name = _from_rank0(f".tmp_{step_dir_name(step)}_{uuid.uuid4().hex[:8]}")
    tmp = os.path.join(root, tmp_name)
    file = os.path.join(tmp, shard_name(rank))
    report = {"file": shard_name(rank), "bytes": 0, "params": {}, "error": None}
    bad = _non_finite(shard)  # the state is on the CPU already: one isfinite pass, before any byte is written
    if bad:
        report["error"] = f"{bad} on rank {rank}): an update diverged (lower --lr)"
    else:
        try:
            os.makedirs(tmp, exist_ok=True)
            report["bytes"] = _write_shard(file, shard, crash_in_save)
            report["params"] = {k: [list(v.shape), str(v.dtype).replace("torch.", "")]
                                for k, v in shard["weights"].items()}
        except Exception as exc:  # noqa: BLE001 - OSError, or torch's RuntimeError around one (a full disk)
            report["error"] = f"cannot write {file}: {_cause(exc)}"
    reports = _all_gather(report)  # also the barrier: nothing is published before every shard is on disk
    final = os.path.join(root, step_dir_name(step))
    error = next((r["error"] for r in reports if r["error"]), None)
    if error is None:  # the same on every rank: all of them gathered the same reports
        if rank == 0:
            try:
                _publish(root, tmp, final, step, engine, run_info, reports, world)
            except Exception as exc:  # noqa: BLE001 - as above
                error = f"cannot publish {final}: {_cause(exc)}"
            else:
                prune(root, keep, protect=step_dir_name(step))
        error = _from_rank0(error)
    if error:
        if rank == 0:  # every rank is past writing: remove the half-made checkpoint, keep `latest` as it is
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint of step {step} not written: {error}; {_still_latest(root)}")
    return final


def _publish(root, tmp, final, step, engine, run_info, reports, world) -> None:
    grid = engine.grid
    params = {}
    for r in reports:
        for name, (shape, dtype) in r["params"].items():
            params[name] = {"shape": shape, "dtype": dtype, "file": r["file"]}
    manifest = {
        "format": FORMAT, "step": step, "torch": torch.__version__,
        "grid": {"dp": grid.dp_size, "pp": grid.pp_size, "mp": grid.mp_size, "order": grid.order,
                 "world_size": world},
        "schedule": engine.schedule_name, "virtual_stages": engine.num_stages // engine.pp_size,
        "model": run_info["model"], "optimizer": run_info["optimizer"],
        "params": dict(sorted(params.items(), key=lambda kv: _param_order(kv[0]))),
        "files": {r["file"]: r["bytes"] for r in reports},
    }
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if os.path.lexists(final):  # the same step saved again after a restart: move the old one aside first
        if os.path.islink(final) or not os.path.isdir(final) or not _complete(root, os.path.basename(final)):
            raise OSError(errno.EEXIST, f"{final} exists and is not a hybrid_engine checkpoint")
        os.rename(final, os.path.join(root, f".old_{os.path.basename(final)}_{uuid.uuid4().hex[:8]}"))
    os.rename(tmp, final)
    _fsync_dir(root)
    pointer_tmp = os.path.join(root, f".{LATEST}.{uuid.uuid4().hex[:8]}")
    with open(pointer_tmp, "w") as f:
        f.write(os.path.basename(final) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer_tmp, os.path.join(root, LATEST))
    _fsync_dir(root)


def _param_order(name: str) -> tuple[int, str]:
    index, _, leaf = name.partition(".")
    return (int(index), leaf) if index.isdigit() else (1 << 62, name)


def prune(root: str, keep: int, protect: str) -> None:
    """Remove all but the newest `keep` complete checkpoints (never `protect`) and leftovers of interrupted
    saves. Only what this engine wrote is touched: a step_N directory without a valid manifest (a user's, or a
    stray empty one) is neither removed nor counted."""
    complete = [name for _, name in _step_dirs(root) if _complete(root, name)]
    doomed = [name for name in complete[:-keep] if name != protect]
    doomed += [n for n in os.listdir(root) if _LEFTOVER.match(n) and not os.path.islink(os.path.join(root, n))]
    for name in doomed:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


# ------------------------------------------------------------------------------------------------ loading
def _read(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable shard is the same user-facing problem
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint shard {path} cannot be read ({first}): truncated, damaged, or not "
                              "written by hybrid_engine") from None


def _describe(tensor) -> str:
    if not torch.is_tensor(tensor):
        return f"a {type(tensor).__name__}, not a tensor"
    return f"shape {list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"


def _check_tensors(file: str, name: str, entry: dict, weight, state) -> None:
    """A parameter's weight, and every per-element optimizer state of it, must have the shape and dtype the
    manifest records (copy_ would broadcast a [32], a scalar or a [32, 1] into a 32 x 32 weight); only
    Adam's 'step' is a scalar."""
    expected = f"shape {entry['shape']} {entry['dtype']}"

    def refuse(what: str, value) -> None:
        raise CheckpointError(f"checkpoint shard {file} holds {what} as {_describe(value)}; the manifest says "
                              f"{expected}: damaged, or not written by hybrid_engine")

    if not torch.is_tensor(weight) or _describe(weight) != expected:
        refuse(name, weight)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint shard {file} holds optimizer state of {name} as a "
                              f"{type(state).__name__}: damaged, or not written by hybrid_engine")
    for key, value in state.items():
        if key == "step":
            if torch.is_tensor(value) and value.dim() != 0:
                raise CheckpointError(f"checkpoint shard {file} holds optimizer state step of {name} as "
                                      f"{_describe(value)}, not a scalar: damaged, or not written by hybrid_engine")
        elif torch.is_tensor(value) and _describe(value) != expected:
            refuse(f"optimizer state {key} of {name}", value)


def load(engine, ckpt: Checkpoint) -> int:
    """Collective over the world: restore `ckpt` into `engine` on whatever grid the engine runs; returns the
    step to continue from. Raises the same CheckpointError on every rank if any rank cannot read its part."""
    rank, world = _world()
    grid, saved_grid = engine.grid, ckpt.manifest["grid"]
    same_grid = (saved_grid["dp"], saved_grid["pp"], saved_grid["mp"], saved_grid["order"], saved_grid["world_size"]) \
        == (grid.dp_size, grid.pp_size, grid.mp_size, grid.order, world)
    error = None
    try:
        names = engine.checkpoint_names()
        files = sorted({ckpt.manifest["params"][n]["file"] for n in names} | {shard_name(0)})
        shards = {f: _read(os.path.join(ckpt.path, f)) for f in files}
        for f, shard in shards.items():
            if shard.get("format") != FORMAT or shard.get("step") != ckpt.step:
                raise CheckpointError(f"checkpoint shard {os.path.join(ckpt.path, f)} does not belong to this "
                                      f"manifest (format {shard.get('format')!r}, step {shard.get('step')})")
        weights, optimizer = {}, {}
        for n in names:
            entry = ckpt.manifest["params"][n]
            shard = shards[entry["file"]]
            weights[n], optimizer[n] = shard["weights"][n], shard["optimizer"].get(n, {})
            _check_tensors(os.path.join(ckpt.path, entry["file"]), n, entry, weights[n], optimizer[n])
        engine.load_checkpoint_state(weights, optimizer, shards[shard_name(0)]["scaler"])
        if same_grid:
            rng = _read(os.path.join(ckpt.path, shard_name(rank)))["rng"]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and engine.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], engine.device)
    except CheckpointError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged shard raises, every rank must hear of it
        error = f"checkpoint {ckpt.path} is inconsistent ({type(exc).__name__}: {exc})"
    _agree(error)
    return ckpt.step
