"""The Llama's Hugging Face mapping, as one module: the registry's llama entry names it (ModelEntry.hf), and
convert.py reaches it through that entry. The code lives beside it: hf_config.py (config.json <-> LlamaConfig) and
weights.py (tensor names and layouts)."""
from __future__ import annotations

from .hf_config import ARCHITECTURES, hf_config_of
from .hf_config import llama_config_from_hf as config_from_hf
from .weights import check_names, to_engine, to_hf

__all__ = ["ARCHITECTURES", "config_from_hf", "hf_config_of", "check_names", "to_engine", "to_hf"]
