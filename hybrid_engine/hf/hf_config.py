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
import math
import os

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.config.input_files import read_regular_file
from hybrid_engine.models.llama.config import Llama3Scaling, LlamaConfig
from hybrid_engine.models.llama.options import LlamaOptions

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
    if not os.path.lexists(path):
        raise HFError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
    raw = read_regular_file(path, MAX_CONFIG_BYTES, path, "{said} cannot be read ({why})")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HFError(f"{path} cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise HFError(f"{path} is not a JSON object")
    return config


def _said(value) -> str:
    return json.dumps(value) if isinstance(value, (str, type(None), list, dict)) else repr(value)


def _number(table: dict, key: str, where: str, default: float | None = None, name: str | None = None) -> float:
    """table[key] (or default) as a finite number; HFError naming the key otherwise (a string, null, NaN, ...)."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HFError(f"{where}: {name or key} {_said(value)} is not a number")
    return float(value)


def _whole(table: dict, key: str, where: str, default: int | None = None, name: str | None = None) -> int:
    """table[key] (or default) as a whole number: 32.7 is refused, never truncated."""
    value = _number(table, key, where, default, name)
    if not value.is_integer():
        raise HFError(f"{where}: {name or key} {_said(table.get(key, default))} is not a whole number")
    return int(value)


def _table(config: dict, key: str, where: str) -> dict:
    value = config.get(key)
    if value is not None and not isinstance(value, dict):
        raise HFError(f"{where}: {key} {_said(value)} is not an object")
    return value or {}


def _rope(config: dict, where: str) -> tuple[float, Llama3Scaling | None]:
    """(theta, llama3 scaling or None) from either spelling of the RoPE keys."""
    params = _table(config, "rope_parameters", where)
    key = "rope_scaling" if config.get("rope_scaling") is not None else "rope_parameters"
    scaling = _table(config, key, where)
    theta = _number(config, "rope_theta", where, 10000.0)  # checked even where rope_parameters overrides it
    if "rope_theta" in params:
        theta = _number(params, "rope_theta", where, name="rope_parameters.rope_theta")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(kind, str):
        raise HFError(f"{where}: {key}.rope_type {_said(kind)} is not a name")
    if _number(scaling, "partial_rotary_factor", where, 1.0, f"{key}.partial_rotary_factor") != 1.0:
        raise HFError(f"{where}: partial_rotary_factor {scaling['partial_rotary_factor']} is not supported (RoPE "
                      "over every feature of a head only)")
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise HFError(f"{where}: RoPE scaling of rope_type {kind!r} is not supported (default or llama3)")
    for part in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if part not in scaling:
            raise HFError(f"{where}: llama3 RoPE scaling without a usable {part!r}")
    found = Llama3Scaling(*(_number(scaling, k, where, name=f"{key}.{k}")
                            for k in ("factor", "low_freq_factor", "high_freq_factor")),
                          _whole(scaling, "original_max_position_embeddings", where,
                                 name=f"{key}.original_max_position_embeddings"))
    try:
        Llama3Scaling.parse(found.text())  # the engine's own rule, which a run reading model.toml applies
    except ValueError as exc:
        raise HFError(f"{where}: {key} is a llama3 scaling the engine refuses ({exc})") from None
    return theta, found


def check_trainable(cfg: LlamaConfig, where: str) -> None:
    """The [model] table a run reads from the imported model.toml passes the run's own checks (sizes, positions,
    vocabulary, RoPE), so nothing imports that training or sampling it later refuses; checked before any work
    the sizes imply."""
    options = LlamaOptions(layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, seq_len=cfg.seq_len,
                           tie_embeddings=cfg.tie_embeddings, kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden,
                           head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps,
                           rope_scaling=cfg.rope_scaling.text() if cfg.rope_scaling else None,
                           max_positions=cfg.max_positions, vocab_size=cfg.vocab_size, qkv_bias=cfg.qkv_bias)
    try:
        options.check()
    except ConfigError as exc:
        raise HFError(f"{where}: a model the engine refuses to train ({exc})") from None


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
    for key in ("attention_bias", "tie_word_embeddings", "use_sliding_window"):
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise HFError(f"{where}: {key} {_said(config[key])} is not true or false")
    if config.get("attention_bias", False):
        raise HFError(f"{where}: attention_bias true is not supported for {archs[0]} (biases on q, k, v and o)")
    notes, max_positions = [], _whole(config, "max_position_embeddings", where)
    if max_positions < 1:
        raise HFError(f"{where}: max_position_embeddings {max_positions} is not a positive whole number")
    if family == "qwen2":
        if config.get("use_sliding_window", False):
            raise HFError(f"{where}: use_sliding_window true is not supported (full causal attention only)")
        types = config.get("layer_types") or []
        if not isinstance(types, list) or any(t != "full_attention" for t in types):
            raise HFError(f"{where}: layer_types other than full_attention are not supported")
    window = sliding_window(config, where)
    if window is not None and window < max_positions:
        max_positions = window
        notes.append(f"note: sliding_window {window}: max_positions capped at it (attention within the window "
                     "is full causal attention, which is what the engine computes)")
    theta, scaling = _rope(config, where)
    sizes = {k: _whole(config, k, where) for k in ("vocab_size", "num_hidden_layers", "hidden_size",
                                                   "num_attention_heads", "intermediate_size")}
    kv_heads = _whole(config, "num_key_value_heads", where) if config.get("num_key_value_heads") is not None \
        else sizes["num_attention_heads"]
    head_dim = _whole(config, "head_dim", where) if config.get("head_dim") is not None else 0
    try:
        cfg = LlamaConfig(
            vocab_size=sizes["vocab_size"], layers=sizes["num_hidden_layers"], hidden=sizes["hidden_size"],
            heads=sizes["num_attention_heads"], kv_heads=kv_heads, ffn_hidden=sizes["intermediate_size"],
            seq_len=max(1, min(max_positions, 4096)), tie_embeddings=config.get("tie_word_embeddings") is True,
            rope_theta=theta, rope_scaling=scaling, norm_eps=_number(config, "rms_norm_eps", where, 1e-6),
            head_dim=head_dim, max_positions=max_positions, qkv_bias=family == "qwen2")
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise HFError(f"{where}: {exc}") from None
    check_trainable(cfg, where)
    return cfg, archs[0], notes


def sliding_window(config: dict, where: str = "config.json") -> int | None:
    """The attention window of a Mistral config (None: none): attention limited to it, so logits of longer
    sequences differ from full causal attention's."""
    archs = config.get("architectures")
    mistral = isinstance(archs, list) and len(archs) == 1 and ARCHITECTURES.get(archs[0]) == "mistral"
    if not mistral or config.get("sliding_window") is None:
        return None
    window = _whole(config, "sliding_window", where)
    if window < 1:
        raise HFError(f"{where}: sliding_window {window} is not a positive whole number")
    return window


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
