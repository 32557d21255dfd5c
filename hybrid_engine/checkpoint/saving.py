"""Checkpoints: saved on one grid, loaded on any grid; a crash never leaves a half-written one behind.

Layout of a save directory (it must be visible to every rank: one filesystem, or a shared one across nodes):

    DIR/latest                  the name of the newest complete checkpoint ("step_000010"), replaced atomically
    DIR/step_000010/
        manifest.json           format tag, step, grid, schedule, model config, data, optimizer, every
                                parameter's full shape and the shard holding it, every shard's size and SHA-256
        rank_00000.pt ...       one shard per rank (torch.save, loaded with weights_only=True)
    DIR/.tmp_step_000012_<id>/  a save in progress, or written and waiting to be published (or one a crash
                                interrupted: ignored, removed by the next publish)
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

Atomic save, in two collective steps. `write`: every rank writes its shard into a fresh temporary directory,
hashing it on the way (checkpoint/digest.py), and fsyncs it; the ranks agree that all shards are complete (one
all_gather); rank 0 writes the manifest. `publish` (the trainer calls it only once the next step's loss is
finite and no spike: hybrid_engine/train/divergence.py): rank 0 writes the new pointer's content to a temporary file,
renames the directory into place and replaces `latest` (os.replace). A crash or a full disk at any point leaves
`latest` on the previous published checkpoint and no step_N that it does not name. Then all but the newest
`keep` complete checkpoints (a step_N directory with a valid manifest: nothing else is counted or removed) and
leftovers of interrupted saves are removed; the checkpoint just published is never removed. Nothing is
published when any rank's weights or optimizer state are not finite, or any rank cannot write its shard: the
temporary directory is removed and every rank raises the same error, naming the cause (the OS error behind
torch's), with `latest` untouched.

One run per directory. Rank 0 holds an flock on DIR/.lock from before the first collective to its exit (the
kernel drops it however the process ends); a second run's rank 0 fails to take it and every rank of that run
stops before training (agree_on_directory_holds).

Nothing outside. Only names the engine writes are followed (`latest` holds step_NNNNNN; manifest shards are
rank_NNNNN.pt), each inside its directory; only regular files are read (no symbolic links, FIFOs or devices:
O_NOFOLLOW | O_NONBLOCK), `latest` up to 4 KiB and the manifest up to 64 MiB, and the manifest is checked
field by field. Every shard read must have the SHA-256 the manifest records, and every tensor in it the shape
and dtype.

Agreement. Loading is checked on every rank before any collective (`open_checkpoint`, `check_compatible`:
manifest, format, fields, shapes, shard sizes; the same files give every rank the same answer), and reading the shards
ends with one all_gather of the outcome, so a bad checkpoint stops every rank with the same CheckpointError,
never leaves some ranks waiting in a collective.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from dataclasses import dataclass

import torch

from .agree import _all_gather, _from_rank0, _world
from .digest import HashingWriter
from hybrid_engine.config.checkpoint_model import MODEL_TOML
from .update_settings import SAID_AS
from .files import (FORMAT, LATEST, MANIFEST, Checkpoint, CheckpointError, _complete, _LEFTOVER, _step_dirs, latest_path,
                    shard_name, step_dir_name)

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


def _write_shard(path: str, shard: dict, crash: bool) -> tuple[int, str]:
    """Write and fsync one shard; (its size, its SHA-256, hashed on the way to the file)."""
    with open(path, "wb") as f:
        if crash:  # test hook: half a shard reaches the disk, then the process dies (see hybrid_engine.runtime.faults)
            import io
            import signal

            buffer = io.BytesIO()
            torch.save(shard, buffer)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        writer = HashingWriter(f)
        torch.save(shard, writer)
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path), writer.hexdigest()


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
    """What `latest` names after a save failed: said only of a pointer that is really there."""
    pointer = os.path.join(root, LATEST)
    try:
        previous = latest_path(root)
    except CheckpointError:
        return f"{pointer} is as it was"
    if previous is None:
        return f"{root} holds no earlier checkpoint"
    if not os.path.lexists(pointer):
        return f"{root} has no {LATEST} (its newest complete checkpoint is {os.path.basename(previous)})"
    return f"{pointer} still names {os.path.basename(previous)}"


@dataclass(frozen=True)
class Written:
    """A checkpoint whose shards and manifest are on disk in a temporary directory, not yet `latest`."""

    root: str
    step: int
    tmp: str

    @property
    def final(self) -> str:
        return os.path.join(self.root, step_dir_name(self.step))


def write(engine, root: str, step: int, run_info: dict, crash_in_save: bool = False) -> Written:
    """Collective over the world: write the checkpoint of `step` completed steps under `root` (every rank its
    shard, rank 0 the manifest) into a temporary directory; `publish` makes it `latest`. run_info: {"model":
    {...}, "optimizer": name, optional "data": {...}} (recorded in the manifest). Unless every rank's state is
    finite and on disk, the temporary directory is removed and every rank raises the same CheckpointError."""
    rank, world = _world()
    state = engine.state_for_checkpoint()  # MP all-gathers: every rank, same order
    coords = engine.groups.coords
    owner = coords.dp == 0 and coords.cp == 0 and coords.mp == 0  # one of the copies over dp x cp
    shard = {"format": FORMAT, "step": step, "rank": rank, "rng": _rng_state(engine.device),
             "scaler": state["scaler"], "weights": state["weights"] if owner else {},
             "optimizer": state["optimizer"] if owner else {}}
    tmp_name = _from_rank0(f".tmp_{step_dir_name(step)}_{uuid.uuid4().hex[:8]}")
    tmp = os.path.join(root, tmp_name)
    file = os.path.join(tmp, shard_name(rank))
    report = {"file": shard_name(rank), "bytes": 0, "sha256": None, "params": {}, "error": None}
    bad = _non_finite(shard)  # the state is on the CPU already: one isfinite pass, before any byte is written
    if bad:
        report["error"] = f"{bad} on rank {rank}): an update diverged (lower --lr)"
    else:
        try:
            os.makedirs(tmp, exist_ok=True)
            report["bytes"], report["sha256"] = _write_shard(file, shard, crash_in_save)
            report["params"] = {k: [list(v.shape), str(v.dtype).replace("torch.", "")]
                                for k, v in shard["weights"].items()}
        except Exception as exc:  # noqa: BLE001 - OSError, or torch's RuntimeError around one (a full disk)
            report["error"] = f"cannot write {file}: {_cause(exc)}"
    reports = _all_gather(report)  # also the barrier: the manifest is written once every shard is on disk
    error = next((r["error"] for r in reports if r["error"]), None)
    if error is None and rank == 0:  # the same on every rank: all of them gathered the same reports
        try:
            grid = engine.grid
            layout = {"grid": {"dp": grid.dp_size, "pp": grid.pp_size, "mp": grid.mp_size, "order": grid.order,
                               "world_size": world},
                      "schedule": engine.schedule_name, "virtual_stages": engine.num_stages // engine.pp_size}
            write_manifest(tmp, step, layout, run_info, reports)
        except Exception as exc:  # noqa: BLE001 - as above
            error = f"cannot write {os.path.join(tmp, MANIFEST)}: {_cause(exc)}"
    error = _from_rank0(error)
    written = Written(root, step, tmp)
    if error:
        discard(written)
        raise CheckpointError(f"checkpoint of step {step} not written: {error}; {_still_latest(root)}")
    return written


def publish(written: Written, keep: int = 3, model_toml: str | None = None) -> str:
    """Collective over the world: make a written checkpoint `DIR/step_N` and `latest` (rank 0 renames it into
    place and replaces the pointer), then keep the newest `keep` complete checkpoints. Every rank raises the
    same CheckpointError if rank 0 cannot; the written checkpoint is then removed and `latest` is as it was.
    model_toml: DIR/model.toml's text (config/checkpoint_model.py), written first where it differs."""
    error = None
    if _world()[0] == 0:
        try:
            if model_toml is not None:
                _write_model_toml(written.root, model_toml)
            _rename_into_place(written)
        except Exception as exc:  # noqa: BLE001 - OSError, or a directory in the way
            error = f"cannot publish {written.final}: {_cause(exc)}"
        else:
            prune(written.root, keep, protect=step_dir_name(written.step))
    error = _from_rank0(error)
    if error:
        discard(written)
        raise CheckpointError(f"checkpoint of step {written.step} not written: {error}; "
                              f"{_still_latest(written.root)}")
    return written.final


def _write_model_toml(root: str, text: str) -> None:
    path = os.path.join(root, MODEL_TOML)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def discard(written: Written) -> None:
    """Remove a written checkpoint that will not be published (rank 0; every rank is past writing it)."""
    if _world()[0] == 0:
        shutil.rmtree(written.tmp, ignore_errors=True)


def save(engine, root: str, step: int, run_info: dict, keep: int = 3, crash_in_save: bool = False) -> str:
    """Collective over the world: `write` the checkpoint of `step` and `publish` it at once (for callers that
    have nothing to wait for; the trainer publishes only after the next step's loss is finite)."""
    return publish(write(engine, root, step, run_info, crash_in_save), keep)


def write_manifest(tmp: str, step: int, layout: dict, run_info: dict, reports: list[dict]) -> None:
    """The manifest of a checkpoint whose shards are written (reports: each shard's file, bytes, sha256 and
    {param: [shape, dtype]}); layout: the "grid", "schedule" and "virtual_stages" that wrote it."""
    params = {}
    for r in reports:
        for name, (shape, dtype) in r["params"].items():
            params[name] = {"shape": shape, "dtype": dtype, "file": r["file"]}
    manifest = {
        "format": FORMAT, "step": step, "torch": torch.__version__, **layout,
        "model": run_info["model"], "optimizer": run_info["optimizer"],
        **{key: run_info[key] for key in ("data", *SAID_AS) if key in run_info},
        "params": dict(sorted(params.items(), key=lambda kv: _param_order(kv[0]))),
        "files": {r["file"]: r["bytes"] for r in reports},
        "sha256": {r["file"]: r["sha256"] for r in reports},
    }
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)


def _rename_into_place(written: Written) -> None:
    """tmp -> DIR/step_N and `latest` -> step_N. The pointer's content is written first, so that a full disk
    fails before anything moved; a failure at any point leaves `latest` and every step_N as they were."""
    root, final = written.root, written.final
    pointer_tmp = _pointer_file(root, os.path.basename(final))
    try:
        if os.path.lexists(final):  # the same step saved again after a restart: move the old one aside first
            if os.path.islink(final) or not os.path.isdir(final) or not _complete(root, os.path.basename(final)):
                raise OSError(errno.EEXIST, f"{final} exists and is not a hybrid_engine checkpoint")
            os.rename(final, os.path.join(root, f".old_{os.path.basename(final)}_{uuid.uuid4().hex[:8]}"))
        os.rename(written.tmp, final)
        try:
            os.replace(pointer_tmp, os.path.join(root, LATEST))
        except OSError:
            os.rename(final, written.tmp)  # not published after all: back to where discard finds it
            raise
        _fsync_dir(root)
    finally:
        if os.path.lexists(pointer_tmp):
            os.unlink(pointer_tmp)


def _pointer_file(root: str, name: str) -> str:
    """A fsynced temporary file holding `name`, to os.replace `latest` with; removed again if it cannot be."""
    pointer_tmp = os.path.join(root, f".{LATEST}.{uuid.uuid4().hex[:8]}")
    try:
        with open(pointer_tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if os.path.lexists(pointer_tmp):
            os.unlink(pointer_tmp)
        raise
    return pointer_tmp


def _point_latest(root: str, name: str) -> None:
    """Replace root/latest with `name`, atomically."""
    pointer_tmp = _pointer_file(root, name)
    try:
        os.replace(pointer_tmp, os.path.join(root, LATEST))
    finally:
        if os.path.lexists(pointer_tmp):
            os.unlink(pointer_tmp)
    _fsync_dir(root)


def rewind_latest(root: str, ckpt: Checkpoint) -> None:
    """Collective: point root/latest at `ckpt`, an older checkpoint of root that this run continues from (the
    newer ones stay on disk). Every rank raises the same CheckpointError if rank 0 cannot."""
    error = None
    if _world()[0] == 0:
        try:
            _point_latest(root, os.path.basename(os.path.normpath(ckpt.path)))
        except OSError as exc:
            error = f"cannot point {os.path.join(root, LATEST)} at {ckpt.path}: {_cause(exc)}"
    error = _from_rank0(error)
    if error:
        raise CheckpointError(error)


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
