"""Tiny random Hugging Face models for the Llama tests, made by `transformers` itself (no download): GQA with RoPE
(untied), tied embeddings with one kv head and Llama 3 RoPE scaling, Qwen2 (q/k/v biases, drawn nonzero here) and
Mistral (a sliding window). Each is saved with save_pretrained, as a user's directory would be."""
from __future__ import annotations

import os
import warnings

import torch

VOCAB, HIDDEN, FFN, LAYERS, HEADS, MAX_POS = 67, 32, 48, 4, 4, 64
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
KINDS = {
    "gqa": dict(num_key_value_heads=2, rope_theta=500.0),
    "tied": dict(num_key_value_heads=1, tie_word_embeddings=True, rope_scaling=LLAMA3),
    "qwen2": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2, sliding_window=32),
}


def make(kind: str, path: str, seed: int = 0):
    """The model of `kind`, in eval mode, saved under `path` (fp32)."""
    warnings.filterwarnings("ignore", module="transformers")
    import transformers

    family = {"qwen2": "Qwen2", "mistral": "Mistral"}.get(kind, "Llama")
    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, max_position_embeddings=MAX_POS, rms_norm_eps=1e-5, **KINDS[kind])
    torch.manual_seed(seed)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)  # not all ones: a norm applied wrongly shows
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits
