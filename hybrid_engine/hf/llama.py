"""The Llama's Hugging Face mapping, as one module: the registry's llama entry names it (ModelEntry.hf), and
convert.py reaches it through that entry. The code lives beside it: hf_config.py (config.json <-> LlamaConfig, and
what a config may hold) and weights.py (tensor names and layouts, and the checkpoint's shapes)."""
from __future__ import annotations

from .hf_config import ARCHITECTURES, check_trainable, hf_config_of, sliding_window
from .hf_config import llama_config_from_hf as config_from_hf
from .weights import check_engine_shapes, check_names, to_engine, to_hf

__all__ = ["ARCHITECTURES", "config_from_hf", "hf_config_of", "check_trainable", "sliding_window", "check_names",
           "check_engine_shapes", "to_engine", "to_hf"]
