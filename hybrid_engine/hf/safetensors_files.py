"""A Hugging Face directory's weights: model.safetensors, or the shards model.safetensors.index.json names, read
one tensor at a time (each file memory-mapped by safetensors, a tensor copied out only when asked for); and
written back the same way transformers writes them, in shards of at most `max_shard_bytes`, with the index when
there is more than one."""
from __future__ import annotations

import json
import os
import stat
from typing import Iterable

import torch

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.config.input_files import kind_of, read_regular_file

from .hf_config import HFError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
METADATA = {"format": "pt"}  # what transformers writes, and checks when it loads
MAX_INDEX_BYTES = 64 << 20  # a weight map of some million tensors


def _safetensors():
    try:
        import safetensors.torch
        from safetensors import safe_open
    except ImportError:
        raise HFError("Hugging Face weights need the safetensors package: pip install safetensors") from None
    return safe_open, safetensors.torch


def _check_regular(path: str) -> None:
    """Only a regular file (a link to one, as the Hub's cache makes, is followed) is handed to safetensors: opening
    a FIFO would wait for a writer that may never come."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise HFError(f"{path} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise HFError(f"{path} is {kind_of(mode)}, not a safetensors file")


class HFWeights:
    """The tensors of a Hugging Face model directory, by name; a context manager that closes its files."""

    def __init__(self, hf_dir: str):
        safe_open, _ = _safetensors()
        index = os.path.join(hf_dir, INDEX)
        if os.path.lexists(index):
            raw = read_regular_file(index, MAX_INDEX_BYTES, index)
            try:
                weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
                files = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise HFError(f"{index} cannot be read as a safetensors index ({exc})") from None
        elif os.path.lexists(os.path.join(hf_dir, SINGLE)):
            weight_map, files = None, [SINGLE]
        else:
            raise HFError(f"{hf_dir} has neither {SINGLE} nor {INDEX} (only safetensors weights are read)")
        self._files, self._where = {}, {}
        try:
            for name in files:
                if not isinstance(name, str) or os.sep in name or name in ("", ".", ".."):
                    raise HFError(f"{index} names {name!r}, not a file of {hf_dir}")
                _check_regular(os.path.join(hf_dir, name))
                handle = safe_open(os.path.join(hf_dir, name), framework="pt")
                self._files[name] = handle
                for key in handle.keys():
                    if weight_map is not None and weight_map.get(key) != name:
                        raise HFError(f"{os.path.join(hf_dir, name)} holds {key}, which {INDEX} puts elsewhere")
                    self._where[key] = name
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own errors for a damaged header
            raise HFError(f"{hf_dir}: a safetensors file cannot be read ({str(exc).splitlines()[0]})") from None
        if weight_map is not None and set(weight_map) - set(self._where):
            missing = sorted(set(weight_map) - set(self._where))[0]
            raise HFError(f"{index} names {missing}, which no shard holds")

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> torch.Tensor:
        return self._files[self._where[name]].get_tensor(name)

    def close(self) -> None:
        self._files.clear()

    def __enter__(self) -> "HFWeights":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_weights(out_dir: str, tensors: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int) -> list[str]:
    """Write (name, tensor) pairs as transformers does: one model.safetensors, or model-0000k-of-0000n.safetensors
    shards of at most max_shard_bytes (a bigger tensor alone) and their index; a shard is written as soon as it is
    full, so memory holds one shard. Returns the files written."""
    _, st = _safetensors()
    shards: list[str] = []
    weight_map: dict[str, int] = {}
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            tmp = os.path.join(out_dir, f".shard_{len(shards):05d}.safetensors")
            st.save_file(pending, tmp, metadata=METADATA)
            shards.append(tmp)
            pending, size = {}, 0

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > max_shard_bytes:
            flush()
        pending[name] = tensor.contiguous()
        weight_map[name] = len(shards)
        size += nbytes
        total += nbytes
    flush()
    if len(shards) == 1:
        os.replace(shards[0], os.path.join(out_dir, SINGLE))
        return [SINGLE]
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    for tmp, name in zip(shards, names):
        os.replace(tmp, os.path.join(out_dir, name))
    index = {"metadata": {"total_size": total}, "weight_map": {n: names[k] for n, k in sorted(weight_map.items())}}
    with open(os.path.join(out_dir, INDEX), "w") as f:
        json.dump(index, f, indent=2)
    return names + [INDEX]
