"""The models the engine trains, each a function of the seed alone (seeded initial weights and `materialize`:
init.py): the course MLP (mlp/), a GPT (gpt/) and a Llama (llama/), the last two plain PyTorch with a parallelize
plan each; what the driver needs to train each as one value (workload.py); everything the engine needs of a model,
as its entry (entry.py), found by name in the registry (registry.py: `register(name, ModelEntry(...))` adds one); their
losses (losses.py); whether a model can fit at all (memory_estimate.py). The MLP's public names are this package's.

Imports: config, data, parallel (each model's tensor-parallel split), metrics' peaks. The engine imports
`materialize` and the losses from here.
"""
from __future__ import annotations

from .mlp.data import SyntheticRegression
from .init import materialize, stream_seed
from .mlp.model import SeededLinear, large_linear_model
from .registry import ModelEntry, RegistryError, Sampler, register, registered

__all__ = [
    "ModelEntry",
    "RegistryError",
    "Sampler",
    "register",
    "registered",
    "SeededLinear",
    "SyntheticRegression",
    "large_linear_model",
    "materialize",
    "stream_seed",
]
