"""Every model the engine trains, by name: its entry (models/entry.py) gives everything the rest of the engine needs
of it, and every part that knows models asks here. A model is a folder, models/<name>/, holding

    options.py      its [model] keys and flags: a frozen dataclass, each field documented (config/fields.py)
    workload.py     build(cfg, device) -> Workload; check(cfg, grid, device_type): its rules, raised as one
                    ConfigError line before the first collective; shape(cfg): the planner's view of it
    parallelize.py  its tensor-parallel plan (the MLP's is parallel/tensor's parallelize_mlp)
    model.py ...    the model itself, drawing its weights from the seed streams the registry gives it

and one line below. A model from elsewhere (a plugin, a test) registers itself:

    from hybrid_engine.models import ModelEntry, register, registered
    register("tiny", ModelEntry(options=TinyOptions, build=build, check=check, parallelize=plan, shape=shape))
    with registered("tiny", entry): ...          # the same, undone on leaving the block

Then `--model tiny` trains it, the planner plans it, and a duplicate name, a missing field or a seed stream another
model draws from is one RegistryError line. Names are kept in registration order: the built-in models first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Iterator

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.parallel.tensor.layers import parallelize_mlp

from .entry import ModelEntry, RegistryError, Sampler
from .gpt import workload as gpt
from .gpt.model import SEED_STREAMS as GPT_STREAMS
from .gpt.parallelize import build_gpt
from .gpt.options import GPTOptions
from .llama import workload as llama
from .llama.model import SEED_STREAMS as LLAMA_STREAMS
from .llama.parallelize import build_llama
from .llama.options import LlamaOptions
from .llama.parallelize import ParallelizeLlama
from .memory_estimate import gpt_weight_bytes
from .token_workload import check_context_split
from .mlp import workload as mlp
from .mlp.model import SEED_STREAMS as MLP_STREAMS
from .mlp.options import MLPOptions
from .workload import Workload

__all__ = ["ModelEntry", "RegistryError", "Sampler", "register", "registered", "entry", "names", "options",
           "check_model", "build_workload", "of_checkpoint"]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")

_MODELS: dict[str, ModelEntry] = {}  # the registry itself: filled below, changed only by register / registered


def _next_streams(count: int) -> tuple[int, ...]:
    first = 1 + max((s for e in _MODELS.values() for s in e.seed_streams), default=0)
    return tuple(range(first, first + count))


def register(name: str, model: ModelEntry) -> ModelEntry:
    """Add a model under `name`; returns its entry as registered (its seed streams filled in). RegistryError: a name
    that is not lower-case letters, digits and _, one already registered, an entry that is not a ModelEntry, or seed
    streams other than the next ones the registry gives."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegistryError(f"a model's name is lower-case letters, digits and _, starting with a letter: {name!r}")
    if name in _MODELS:
        raise RegistryError(f"model {name!r} is registered already: pick another name")
    if not isinstance(model, ModelEntry):
        raise RegistryError(f"model {name!r}: its entry must be a ModelEntry (models/entry.py), got "
                            f"{type(model).__name__}")
    given = _next_streams(len(model.seed_streams) if model.seed_streams else 1)
    if model.seed_streams is not None and model.seed_streams != given:
        owners = [n for n, e in _MODELS.items() if set(e.seed_streams) & set(model.seed_streams)]
        whose = f", which {owners[0]} draws from" if owners else ""
        raise RegistryError(f"model {name!r} draws from seed streams {model.seed_streams}{whose}: the registry gives "
                            f"it {given} (streams go in registration order, so no two models share one)")
    label = model.checkpoint_name or name
    if any((e.checkpoint_name or n) == label for n, e in _MODELS.items()):
        raise RegistryError(f"model {name!r}: another model's checkpoints are named {label!r} already")
    _MODELS[name] = dataclasses.replace(model, seed_streams=given, title=model.title or name)
    return _MODELS[name]


@contextlib.contextmanager
def registered(name: str, model: ModelEntry) -> Iterator[ModelEntry]:
    """register(name, model) for the block's length (a test's model stays out of every other test)."""
    added = register(name, model)
    try:
        yield added
    finally:
        del _MODELS[name]


def entry(name: str) -> ModelEntry:
    """The entry of model `name`; ConfigError (one line, the registered names) if there is none."""
    try:
        return _MODELS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"no model named {name!r} is registered (models: {', '.join(_MODELS)})") from None


def names() -> tuple[str, ...]:
    """Every registered model, in registration order."""
    return tuple(_MODELS)


def options() -> dict[str, type]:
    """Each model's options class by name: what the configuration takes (config/flags.py, RunConfig.from_tables)."""
    return {name: model.options for name, model in _MODELS.items()}


def of_checkpoint(model: object) -> tuple[str, ModelEntry] | None:
    """(registry name, entry) of the model a checkpoint manifest's "model" entry names; None if none does."""
    label = model.get("name") if isinstance(model, dict) else None
    for name, found in _MODELS.items():
        if (found.checkpoint_name or name) == label:
            return name, found
    return None


def check_model(cfg, grid, device_type: str) -> None:
    """The chosen model's own rules (RunConfig.validate calls this first, once the grid is known), after --cp's."""
    check_context_split(cfg.model.options, grid)
    entry(cfg.model.name).check(cfg, grid, device_type)


def build_workload(cfg, device="cpu") -> Workload:
    """The run's model, loss, stage cut and data; the model is on the meta device. Its tensor-parallel function
    is the entry's parallelize (or an instance of it, made with the run's options); RegistryError if not."""
    model = entry(cfg.model.name)
    workload = model.build(cfg, device)
    plan, split = model.parallelize, workload.parallelize
    if not (split is plan or (isinstance(plan, type) and isinstance(split, plan))):
        raise RegistryError(f"model {cfg.model.name!r}: its workload splits the model with {split!r}, not its "
                            f"entry's parallelize {plan!r}")
    return workload


register("mlp", ModelEntry(options=MLPOptions, build=mlp.build, check=mlp.check, parallelize=parallelize_mlp,
                           shape=mlp.shape, seed_streams=MLP_STREAMS, title="MLP", checkpoint_name=mlp.CHECKPOINT_NAME))
register("gpt", ModelEntry(options=GPTOptions, build=gpt.build, check=gpt.check, parallelize=gpt.ParallelizeGPT,
                           shape=gpt.shape, seed_streams=GPT_STREAMS, clip_grad=1.0, title="GPT",
                           sampler=Sampler(gpt.gpt_config_of, gpt.gpt_checkpoint_model, build_gpt,
                                           gpt_weight_bytes)))
register("llama", ModelEntry(options=LlamaOptions, build=llama.build, check=llama.check, parallelize=ParallelizeLlama,
                             shape=llama.shape, seed_streams=LLAMA_STREAMS, clip_grad=1.0, title="Llama",
                             sampler=Sampler(llama.llama_config_of, llama.llama_checkpoint_model,
                                             build_llama, llama.llama_weight_bytes, padded_vocab=True),
                             hf="hybrid_engine.hf.llama"))
