"""Every model the driver trains, by name, one line each. A model is a folder, models/<name>/, holding

    options.py    its [model] keys and flags: a frozen dataclass, each field documented (config/fields.py)
    workload.py   build(cfg, device) -> Workload, and check(cfg, grid, device_type): its rules, raised as one
                  ConfigError line before the first collective
    model.py ...  the model itself

The driver hands OPTIONS to the configuration (config/flags.py, RunConfig.from_tables), checks a run with
check_model and builds it with build_workload. Adding a model is its folder and one line below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .gpt import workload as gpt
from .gpt.options import GPTOptions
from .llama import workload as llama
from .llama.options import LlamaOptions
from .mlp import workload as mlp
from .mlp.options import MLPOptions
from .workload import Workload


@dataclass(frozen=True)
class ModelEntry:
    options: type  # the model's [model] keys and flags
    build: Callable[..., Workload]  # (RunConfig, device) -> Workload
    check: Callable[..., None]  # (RunConfig, grid, device_type): the model's rules, before the first collective


MODELS: dict[str, ModelEntry] = {
    "mlp": ModelEntry(MLPOptions, mlp.build, mlp.check),
    "gpt": ModelEntry(GPTOptions, gpt.build, gpt.check),
    "llama": ModelEntry(LlamaOptions, llama.build, llama.check),
}
OPTIONS: dict[str, type] = {name: entry.options for name, entry in MODELS.items()}


def check_model(cfg, grid, device_type: str) -> None:
    """The chosen model's own rules (RunConfig.validate calls this first, once the grid is known)."""
    MODELS[cfg.model.name].check(cfg, grid, device_type)


def build_workload(cfg, device="cpu") -> Workload:
    """The run's model, loss, stage cut and data; the model is on the meta device."""
    return MODELS[cfg.model.name].build(cfg, device)
