"""Checkpoints written and read outside a training run (hybrid_engine/hf's import and export): the format, files,
checksums and atomic publish of saving.py, one group of tensors at a time, so that a model larger than memory
streams through (a 7B model imports with one layer in memory).

    path = write_checkpoint(root, model_entry, shards)     # shards: an iterable of {name: full tensor}
    for name, tensor in read_weights(open_checkpoint(path)): ...

A checkpoint written here holds weights only: step 0, no optimizer state (its manifest's optimizer is "none", which
any run's optimizer may load: it starts its state afresh), no loss scaler. Its shards play the part of ranks
(rank_00000.pt holds the first group, ...); its manifest's grid says one pipeline stage per shard, so a run on
exactly that grid restores the RNG state recorded here, which nothing of a fresh run depends on.
"""
from __future__ import annotations

import os
import uuid
from typing import Iterable, Iterator

import torch

from hybrid_engine.config import ConfigError

from .files import FORMAT, NO_OPTIMIZER, Checkpoint, CheckpointError, latest_path, shard_name, step_dir_name
from .loading import read_shard
from .saving import Written, _cause, _write_shard, discard, publish, write_manifest


def write_checkpoint(root: str, model: dict, shards: Iterable[dict[str, torch.Tensor]], step: int = 0) -> str:
    """Write a weights-only checkpoint of `step` under `root` (a new --save directory: one that holds checkpoints
    already is refused), one shard per item of `shards` ({global name: full tensor}, written and dropped before
    the next is drawn), and publish it as root/latest; returns its path. A failure removes what was written."""
    if os.path.isdir(root) and latest_path(root) is not None:
        raise CheckpointError(f"{root} already holds checkpoints (latest {latest_path(root)}): choose a new directory")
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".tmp_{step_dir_name(step)}_{uuid.uuid4().hex[:8]}")
    written = Written(root, step, tmp)
    reports = []
    try:
        os.makedirs(tmp)
        for weights in shards:
            file = shard_name(len(reports))
            shard = {"format": FORMAT, "step": step, "rank": len(reports), "rng": {"torch": torch.get_rng_state()},
                     "scaler": None, "weights": weights, "optimizer": {}}
            size, digest = _write_shard(os.path.join(tmp, file), shard, crash=False)
            reports.append({"file": file, "bytes": size, "sha256": digest,
                            "params": {k: [list(v.shape), str(v.dtype).replace("torch.", "")]
                                       for k, v in weights.items()}})
        if not reports:
            raise CheckpointError("nothing to write: no tensors")
        n = len(reports)
        layout = {"grid": {"dp": 1, "pp": n, "mp": 1, "order": "mp-dp-pp", "world_size": n}, "schedule": "none",
                  "virtual_stages": 1}
        write_manifest(tmp, step, layout, {"model": model, "optimizer": NO_OPTIMIZER}, reports)
    except ConfigError:  # a refusal of its own, or of the shards' source (a tensor it cannot take): said as it is
        discard(written)
        raise
    except Exception as exc:  # noqa: BLE001 - a full disk (OSError, or torch's RuntimeError around one)
        discard(written)
        raise CheckpointError(f"cannot write a checkpoint under {root}: {_cause(exc)}") from None
    return publish(written, keep=1)


def read_weights(ckpt: Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    """(global name, full tensor) of every parameter in the manifest's order, each shard's checksum checked before
    it is read; a shard is memory-mapped and dropped once its last tensor is handed on."""
    params = ckpt.manifest["params"]
    sums = ckpt.checksums or {}
    file, shard = None, None
    for name, entry in params.items():
        if entry["file"] != file:
            file, shard = entry["file"], read_shard(os.path.join(ckpt.path, entry["file"]), sums.get(entry["file"]))
        tensor = shard.get("weights", {}).get(name) if isinstance(shard, dict) else None
        if not torch.is_tensor(tensor) or list(tensor.shape) != entry["shape"]:
            raise CheckpointError(f"checkpoint {ckpt.path}: shard {file} does not hold {name} of shape "
                                  f"{entry['shape']}: damaged, or not written by hybrid_engine")
        yield name, tensor
