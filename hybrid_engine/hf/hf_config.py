"""A Hugging Face config.json <-> the engine's LlamaConfig: which architectures and keys are understood, and one
line naming the first that is not.

Accepted: LlamaForCausalLM, MistralForCausalLM (a Llama with a sliding window: exact for sequences up to the window,
so max_positions is capped at it) and Qwen2ForCausalLM (a Llama with q/k/v biases; use_sliding_window false).
RoPE: the default, or rope_type "llama3" (Llama 3.1's frequency scaling), in either spelling (transformers 4's
rope_theta + rope_scaling, 5's rope_parameters). Every other key must be one of KNOWN, with a value that changes
nothing the engine computes differently (hidden_act silu, no dropout, no MLP bias, ...), or the import refuses it.
"""
from __future__ import annotations

import json
import os

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.models.llama.config import Llama3Scaling, LlamaConfig

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings")
# No bearing on what the weights compute: token ids, caching, the dtype they were saved in, provenance.
METADATA = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
            "pad_token_id", "use_cache", "initializer_range", "pretraining_tp", "model_type", "architectures"}
SHAPE = set(REQUIRED) | {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                         "rope_parameters", "tie_word_embeddings"}
# key -> the values that compute what the engine computes
FIXED = {"hidden_act": ("silu",), "attention_dropout": (0, 0.0), "mlp_bias": (False,)}
PER_ARCHITECTURE = {"llama": {"attention_bias"}, "mistral": {"sliding_window"},
                    "qwen2": {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}}
MAX_CONFIG_BYTES = 1 << 20


class HFError(ConfigError):
    """A Hugging Face directory the engine cannot import or write; the message is one line."""


def read_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise HFError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise HFError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes: not a model config")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFError(f"{path} cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise HFError(f"{path} is not a JSON object")
    return config


def _rope(config: dict, where: str) -> tuple[float, Llama3Scaling | None]:
    """(theta, llama3 scaling or None) from either spelling of the RoPE keys."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if float(scaling.get("partial_rotary_factor", 1.0) if isinstance(scaling, dict) else 1.0) != 1.0:
        raise HFError(f"{where}: partial_rotary_factor {scaling['partial_rotary_factor']} is not supported (RoPE "
                      "over every feature of a head only)")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise HFError(f"{where}: RoPE scaling of rope_type {kind!r} is not supported (default or llama3)")
    try:
        return theta, Llama3Scaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                    float(scaling["high_freq_factor"]),
                                    int(scaling["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise HFError(f"{where}: llama3 RoPE scaling without a usable {exc}") from None


def llama_config_from_hf(config: dict, where: str = "config.json") -> tuple[LlamaConfig, str, list[str]]:
    """(the LlamaConfig of an HF config, its architecture, notes to print); HFError naming the first key or value
    the engine does not compute as HF does."""
    archs = config.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES):
        raise HFError(f"{where}: architecture {archs!r} is not supported (one of {', '.join(ARCHITECTURES)})")
    family = ARCHITECTURES[archs[0]]
    if config.get("model_type", family) != family:
        raise HFError(f"{where}: model_type {config['model_type']!r} does not match the architecture {archs[0]}")
    known = METADATA | SHAPE | set(FIXED) | PER_ARCHITECTURE[family]
    unknown = sorted(set(config) - known)
    if unknown:
        raise HFError(f"{where}: key {unknown[0]!r} is not supported for {archs[0]}")
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise HFError(f"{where}: key {missing[0]!r} is missing")
    for key, values in FIXED.items():
        if key in config and config[key] not in values:
            raise HFError(f"{where}: {key} {config[key]!r} is not supported (only {values[0]!r})")
    if config.get("attention_bias", False):
        raise HFError(f"{where}: attention_bias true is not supported for {archs[0]} (biases on q, k, v and o)")
    notes, max_positions = [], int(config["max_position_embeddings"])
    if family == "qwen2":
        if config.get("use_sliding_window", False):
            raise HFError(f"{where}: use_sliding_window true is not supported (full causal attention only)")
        if any(t != "full_attention" for t in config.get("layer_types") or []):
            raise HFError(f"{where}: layer_types other than full_attention are not supported")
    window = config.get("sliding_window") if family == "mistral" else None
    if window is not None and window < max_positions:
        max_positions = int(window)
        notes.append(f"note: sliding_window {window}: max_positions capped at it (attention within the window "
                     "is full causal attention, which is what the engine computes)")
    theta, scaling = _rope(config, where)
    try:
        cfg = LlamaConfig(
            vocab_size=int(config["vocab_size"]), layers=int(config["num_hidden_layers"]),
            hidden=int(config["hidden_size"]), heads=int(config["num_attention_heads"]),
            kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            ffn_hidden=int(config["intermediate_size"]), seq_len=min(max_positions, 4096),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)), rope_theta=theta, rope_scaling=scaling,
            norm_eps=float(config.get("rms_norm_eps", 1e-6)), head_dim=int(config.get("head_dim") or 0),
            max_positions=max_positions, qkv_bias=family == "qwen2")
    except (TypeError, ValueError) as exc:
        raise HFError(f"{where}: {exc}") from None
    return cfg, archs[0], notes


def hf_config_of(cfg: LlamaConfig, dtype: str) -> dict:
    """The config.json of an exported model (transformers 4 and 5 both read this spelling of RoPE)."""
    arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
    config = {"architectures": [arch], "model_type": ARCHITECTURES[arch], "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn_hidden, "num_hidden_layers": cfg.layers,
              "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
              "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
              "rope_scaling": None, "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
              "attention_dropout": 0.0, "torch_dtype": dtype}
    if not cfg.qkv_bias:
        config |= {"attention_bias": False, "mlp_bias": False}
    s = cfg.rope_scaling
    if s is not None:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                                  "high_freq_factor": s.high_freq_factor,
                                  "original_max_position_embeddings": s.original_max_positions}
    return config
