"""Import a Hugging Face model into an engine checkpoint, and export one back, streaming: the model is the registered
one whose Hugging Face mapping (ModelEntry.hf, today the Llama's: hf/llama.py) reads the architecture or wrote the
checkpoint.

    import_model(hf_dir, ckpt)   config.json + safetensors -> ckpt/step_000000 (weights only, the file's dtype)
                                  and ckpt/model.toml, the [model] table a run that trains it reads (--config)
    export_model(ckpt, hf_dir)   any checkpoint of the Llama (written on any grid) -> config.json + safetensors
                                  that transformers loads; --like HF_DIR keeps that directory's config.json (its
                                  token ids, its architecture's own keys) and copies its tokenizer files

Neither writes over what it reads, into a run's checkpoint directory, or a folder mixing old and new files
(output_folder.py); a NaN or infinite weight, or one a --dtype cannot hold, is refused (weights.py).

Memory: import holds one layer (one shard of the checkpoint) at a time, export one output shard; the checkpoint's
shards are memory-mapped. export(import(x)) writes x's tensors bit for bit (the same names, dtypes and bytes).
"""
from __future__ import annotations

import importlib
import json
import os
import shutil

import torch

from hybrid_engine.checkpoint import CheckpointError, latest_path, open_checkpoint, read_weights, write_checkpoint
from hybrid_engine.checkpoint.lock import holding_directory
from hybrid_engine.config.checkpoint_model import MODEL_TOML, toml_value
from hybrid_engine.models import registry
from hybrid_engine.models.entry import ModelEntry

from .hf_config import HFError, read_config
from .output_folder import check_export_target, check_import_target, replaced_folder
from .safetensors_files import HFWeights, write_weights

DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.model")


def _mappings() -> list[tuple[str, ModelEntry, object]]:
    """(name, entry, mapping module) of every registered model with a Hugging Face mapping."""
    found = [(name, registry.entry(name)) for name in registry.names()]
    return [(name, e, importlib.import_module(e.hf)) for name, e in found if e.hf]


def _mapping_of_architecture(config: dict, where: str) -> tuple[str, ModelEntry, object]:
    """The model an HF config.json imports as: the one whose mapping reads its architecture."""
    archs = config.get("architectures")
    mappings = _mappings()
    for name, entry, mapping in mappings:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in mapping.ARCHITECTURES:
            return name, entry, mapping
    known = [a for _, _, mapping in mappings for a in mapping.ARCHITECTURES]
    raise HFError(f"{where}: architecture {archs!r} is not supported (one of {', '.join(known)})")


def _mapping_of_checkpoint(ckpt) -> tuple[ModelEntry, object, object]:
    """(entry, mapping module, model config) of a checkpoint's model; one line if it has no Hugging Face mapping."""
    found = registry.of_checkpoint(ckpt.manifest["model"])
    if found is None or not found[1].hf:
        able = " or ".join(f"--model {name}" for name, _, _ in _mappings())
        what = f"the {found[1].title} (--model {found[0]})" if found else "no model the registry knows"
        raise CheckpointError(f"checkpoint {ckpt.path} holds {what}, which has no Hugging Face mapping: export "
                              f"writes a checkpoint of {able}")
    entry = found[1]
    try:
        cfg = entry.sampler.config_of(ckpt.manifest["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {ckpt.path} does not hold a {entry.title} ({exc})") from None
    return entry, importlib.import_module(entry.hf), cfg


def model_toml(name: str, entry: ModelEntry, model: dict) -> str:
    """The [model] table of a run that trains this checkpoint's model: every option its shape fixes (the keys of
    its checkpoint entry that are options of the model)."""
    options = set(model) & set(entry.options.__dataclass_fields__)
    lines = ["[model]", f'name = "{name}"'] + [f"{k} = {toml_value(model[k])}" for k in sorted(options)
                                               if model[k] is not None]
    return "\n".join(lines) + "\n"


def import_model(hf_dir: str, out: str) -> tuple[str, list[str]]:
    """Write the checkpoint of a Hugging Face model directory; (its path, notes to print)."""
    check_import_target(out, [(f"HF_DIR {hf_dir}", hf_dir)])
    config, where = read_config(hf_dir), os.path.join(hf_dir, "config.json")
    name, entry, mapping = _mapping_of_architecture(config, where)
    cfg, arch, notes = mapping.config_from_hf(config, where)
    with HFWeights(hf_dir) as weights:
        held = weights.names()
        mapping.check_names(cfg, held, hf_dir)
        model = entry.sampler.record(cfg)
        with holding_directory(out, f"CKPT {out}"):  # the lock a run holds on its --save
            toml = os.path.join(out, MODEL_TOML)
            if os.path.lexists(toml) and latest_path(out) is None:
                raise HFError(f"{toml} exists: an import writes a new checkpoint directory (choose another)")
            path = write_checkpoint(out, model, mapping.to_engine(cfg, weights.get, held))
            with open(toml + ".tmp", "w") as f:
                f.write(f"# {arch} imported from {os.path.abspath(hf_dir)}\n" + model_toml(name, entry, model))
            os.replace(toml + ".tmp", toml)
    return path, notes


def _check_like(like: str, expected: dict, entry: ModelEntry, mapping) -> None:
    """--like HF_DIR describes the checkpoint's function: every field the engine computes with, and a sliding
    window that would cut attention short of the checkpoint's positions."""
    where = os.path.join(like, "config.json")
    base = read_config(like)
    theirs = entry.sampler.record(mapping.config_from_hf(base, where)[0])
    window = mapping.sliding_window(base, where)
    if window is not None and window < expected["max_positions"]:
        raise HFError(f"--like {like}: its sliding_window {window} cuts attention to {window} tokens, but the "
                      f"checkpoint attends over {expected['max_positions']} positions: logits of longer sequences "
                      "would differ")
    odd = [k for k in expected if k != "max_positions" and theirs[k] != expected[k]]
    if odd:
        raise HFError(f"--like {like}: its {odd[0]} {theirs[odd[0]]} is not the checkpoint's {expected[odd[0]]}")


def export_model(ckpt_path: str, out: str, dtype: str = "auto", like: str | None = None,
                 max_shard_bytes: int = 4 << 30, force: bool = False) -> list[str]:
    """Write a checkpoint's model as a Hugging Face directory (replacing HF_DIR whole); returns the files written."""
    check_export_target(out, force, [(f"CKPT {ckpt_path}", ckpt_path)] + ([(f"--like {like}", like)] if like else []))
    ckpt = open_checkpoint(ckpt_path)
    entry, mapping, cfg = _mapping_of_checkpoint(ckpt)
    mapping.check_trainable(cfg, f"checkpoint {ckpt.path}")
    mapping.check_engine_shapes(cfg, {k: e["shape"] for k, e in ckpt.manifest["params"].items()},
                                f"checkpoint {ckpt.path}")
    expected = {k: v for k, v in entry.sampler.record(cfg).items() if k != "seed"}
    if like is not None:
        _check_like(like, expected, entry, mapping)
    dtypes = {e["dtype"] for e in ckpt.manifest["params"].values()}
    chosen = DTYPES[dtype]
    if chosen is None and len(dtypes) != 1:
        raise HFError(f"checkpoint {ckpt.path} holds tensors of {', '.join(sorted(dtypes))}: pass --dtype")
    label = dtypes.pop() if chosen is None else str(chosen).replace("torch.", "")
    with replaced_folder(out) as tmp:
        written = write_weights(tmp, mapping.to_hf(cfg, read_weights(ckpt), chosen), max_shard_bytes)
        if like is not None:  # its config.json as it is, byte for byte, with the files a user loads beside it
            for name in ("config.json",) + COPIED:
                if os.path.isfile(os.path.join(like, name)):
                    shutil.copyfile(os.path.join(like, name), os.path.join(tmp, name))
                    written.append(name)
        else:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(mapping.hf_config_of(cfg, label), f, indent=2)
                f.write("\n")
            written.append("config.json")
    return written
