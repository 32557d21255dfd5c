"""Loading a checkpoint into an engine on whatever grid it runs: every shard's checksum checked before it is
read, every tensor's shape and dtype checked against the manifest, and the outcome agreed by every rank (see
checkpoint/saving.py for the layout and the rules)."""
from __future__ import annotations

import os

import torch

from .agree import _agree, _world
from .digest import verify
from .files import FORMAT, Checkpoint, CheckpointError, shard_name


def read_shard(path: str, digest: str | None) -> dict:
    """A shard, after its SHA-256 matched the manifest's `digest` (None: a checkpoint without checksums)."""
    verify(path, digest)
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
        sums = ckpt.checksums or {}
        shards = {f: read_shard(os.path.join(ckpt.path, f), sums.get(f)) for f in files}
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
            own = shard_name(rank)
            rng = (shards[own] if own in shards else read_shard(os.path.join(ckpt.path, own), sums.get(own)))["rng"]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and engine.device.type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"], engine.device)
    except CheckpointError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged shard raises, every rank must hear of it
        error = f"checkpoint {ckpt.path} is inconsistent ({type(exc).__name__}: {exc})"
    _agree(error)
    return ckpt.step
