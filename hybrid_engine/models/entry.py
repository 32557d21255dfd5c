"""What a model gives the engine, as one value: its registry entry (models/registry.py holds them by name).

    ModelEntry(options=..., build=..., check=..., parallelize=..., shape=...,      # every model
               sampler=Sampler(...), hf="hybrid_engine.hf.<module>",                # what it can also do
               seed_streams=..., clip_grad=..., title=..., checkpoint_name=...)     # its facts

Every field says what one part of the engine asks of the model: the configuration its options, the driver its
rules, workload and tensor-parallel plan, the planner its shape, `python -m hybrid_engine.sample` its dense rebuild,
`python -m hybrid_engine.hf` its Hugging Face mapping. A missing required field, or one of the wrong kind, is one
RegistryError line when the entry is made.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional


class RegistryError(ValueError):
    """A model entry or registration the registry refuses; the message is one line."""


@dataclass(frozen=True)
class Sampler:
    """A checkpoint's model rebuilt whole in one process, from the "model" entry of its manifest: what `python -m
    hybrid_engine.sample` generates with (the Hugging Face export reads the same entry through it)."""

    config_of: Callable[[dict], object]
    """A checkpoint manifest's "model" entry -> the model's config (ValueError, KeyError or TypeError if it is not
    one); the config has .layers .hidden .heads .seq_len .vocab_size."""
    record: Callable[[object], dict]
    """The inverse of config_of: what a checkpoint of this config records as its "model" entry."""
    build: Callable[..., object]
    """(config, device) -> the dense model, an nn.Sequential whose state_dict names are the checkpoint's."""
    weight_bytes: Callable[[object], float]
    """Bytes of the dense model's weights (a damaged manifest is refused before anything is built)."""
    padded_vocab: bool = False
    """The model's vocabulary is its own and may be larger than its tokenizer's (an imported one's)."""


_REQUIRED = {"options": "its [model] options (a frozen dataclass: models/<name>/options.py)",
             "build": "build(cfg, device) -> Workload",
             "check": "check(cfg, grid, device_type): its rules, before the first collective",
             "parallelize": "its tensor-parallel plan: (stage, mp_group) -> stage",
             "shape": "shape(cfg) -> ModelShape, the planner's view of it"}


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """Everything the engine needs of one model. Required: options, build, check, parallelize, shape."""

    options: Optional[type] = None
    """The model's [model] keys and flags: a frozen dataclass, each field documented (config/fields.py), with
    OPTIMIZER = (name, lr), the run's default, and check(), its ranges before anything is built."""
    build: Optional[Callable[..., object]] = None
    """(RunConfig, device) -> Workload: the model on the meta device, its loss, stage cut and data."""
    check: Optional[Callable[..., None]] = None
    """(RunConfig, grid, device_type): the model's rules, raised as one ConfigError line before any collective."""
    parallelize: Optional[Callable[..., object]] = None
    """The model's tensor-parallel entry point, (stage, mp_group) -> stage, or the class whose instances are (the
    workload makes one with the run's options)."""
    shape: Optional[Callable[..., object]] = None
    """(RunConfig) -> planner ModelShape (models/planner_shape.py): per layer its parameters, FLOPs and bytes, from
    the options alone (nothing is built)."""
    sampler: Optional[Sampler] = None
    """What `python -m hybrid_engine.sample` needs: its checkpoint entry and dense model; None: its checkpoints
    are not sampled from."""
    hf: Optional[str] = None
    """Its Hugging Face import and export: the dotted name of the module of the hf package that maps it (None:
    none). That code sits in hf/, above models/ (it imports them, they never import it), so the entry names it
    and `python -m hybrid_engine.hf` imports it. The module defines ARCHITECTURES (the config.json architectures
    that import as this model), config_from_hf(config, where) -> (config, architecture, notes),
    hf_config_of(config, dtype), check_names(config, held, where), to_engine(config, get, held) and
    to_hf(config, weights, dtype); the model's sampler gives its checkpoint entry (config_of, record)."""
    seed_streams: Optional[tuple[int, ...]] = None
    """The generator streams its weights (and data) draw from (stream_seed(seed, stream, index)). The registry
    gives them out in registration order, so no two models share one: a model whose code draws from fixed streams
    names them here and they must be the next ones given; None: it takes the next stream (register returns the
    entry with it filled in)."""
    clip_grad: float = 0.0
    """The gradient-norm clip a run of it gets when it names none (--clip-grad); 0: none."""
    title: Optional[str] = None
    """Its name in messages ("GPT"); None: its registry name."""
    checkpoint_name: Optional[str] = None
    """Its name in a checkpoint manifest's "model" entry, where that is not its registry name."""

    def __post_init__(self) -> None:
        for name, what in _REQUIRED.items():
            value = getattr(self, name)
            if value is None:
                raise RegistryError(f"a model entry needs {name}: {what}")
            if not callable(value):
                raise RegistryError(f"a model entry's {name} must be callable ({what}), got {value!r}")
        if not dataclasses.is_dataclass(self.options) or not isinstance(self.options, type):
            raise RegistryError(f"a model entry's options must be a dataclass type, got {self.options!r}")
        for name, what in (("OPTIMIZER", "its default (optimizer, lr)"), ("check", "check(): its ranges")):
            if not hasattr(self.options, name):
                raise RegistryError(f"a model entry's options {self.options.__name__} have no {name}: {what}")
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise RegistryError(f"a model entry's sampler must be a Sampler, got {self.sampler!r}")
        if self.hf is not None and (not isinstance(self.hf, str) or self.sampler is None):
            raise RegistryError(f"a model entry's hf must be a module name, beside a sampler (its checkpoint "
                                f"entry), got {self.hf!r}")
        if self.seed_streams is not None and (
                not isinstance(self.seed_streams, tuple) or not self.seed_streams
                or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in self.seed_streams)):
            raise RegistryError(f"a model entry's seed_streams must be a tuple of positive integers, got "
                                f"{self.seed_streams!r}")
