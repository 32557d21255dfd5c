"""The [model] table of a --save directory (DIR/model.toml, beside its step_N checkpoints; `hf import` writes one
too), and its use: a run that starts from a checkpoint (--load, or --resume of its --save) reads the model table
of that checkpoint's directory under its --config file and flags, so continuing needs no shape flags again.

    text = model_toml(cfg)                          # what a run's --save DIR/model.toml holds
    path = model_toml_to_read(load, save, resume)   # the model.toml a run that starts there reads, or None
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

MODEL_TOML = "model.toml"


def toml_value(value) -> str:
    """A value as TOML spells it (every model.toml writer's one spelling)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # numbers and strings: TOML spells them as JSON does


def model_toml(cfg) -> str:
    """The [model] table that trains this run's model again: its name, seed and every option of its class."""
    options = cfg.model.options
    values = {"name": cfg.model.name, "seed": cfg.model.seed,
              **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)}}
    lines = ["[model]"] + [f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None]
    return "# the model of the checkpoints in this directory: --load and --resume read it (flags override it)\n" + \
        "\n".join(lines) + "\n"


def model_toml_to_read(load: str | None, save: str | None, resume: bool) -> str | None:
    """The model.toml of the directory holding the checkpoint a run starts from (--load DIR or DIR/step_N; else
    --resume's --save DIR), when there is one."""
    start = load if load is not None else (save if resume else None)
    if start is None:
        return None
    folder = os.path.normpath(start)
    if re.fullmatch(r"step_\d+", os.path.basename(folder)):  # a checkpoint of a --save DIR: DIR's table
        folder = os.path.dirname(folder)
    path = os.path.join(folder, MODEL_TOML)
    return path if os.path.isfile(path) else None
