"""What the decoder-only transformers (models/gpt, models/llama) share: the projection without an initialisation of
its own, the token lookup, the seeded full-tensor draw every layer makes, the tags of tied and of undecayed
parameters, selective recomputation of the attention core, the next-token loss and generation with a dense model.

Each model's layers draw their full initial tensors from their own (seed, layer) generator with `draw_full`, in
fp32 whatever the parameter dtype, so the values depend on the seed alone (grid invariance); a layer made
tensor-parallel (its model's parallelize.py) draws the same full tensors and keeps its slices.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["INIT_STD", "TIED_EMBEDDINGS", "Dense", "TokenLookup", "draw_full", "embedding_tags", "maybe_recompute",
           "next_token_loss", "generate"]

INIT_STD = 0.02
# param.tied: two copies of one weight on the first and last stage (parallel/data_parallel/tied.py sums them)
TIED_EMBEDDINGS = "word_embeddings"


class Dense(nn.Linear):
    """nn.Linear with no initialisation of its own: the enclosing layer draws W and b (and no draw of the global
    generator is spent on weights that are overwritten)."""

    def reset_parameters(self) -> None:
        pass


class TokenLookup(nn.Module):
    """lookup(tokens, table): the table's rows of the tokens (F.embedding). The table stays its layer's parameter
    (the name checkpoints hold); the lookup is the part a tensor-parallel plan swaps for a vocabulary-split one."""

    def forward(self, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, table)


def draw_full(shape: tuple[int, ...], std: float, gen: torch.Generator, device, dtype) -> torch.Tensor:
    """A full N(0, std) tensor drawn in fp32 (so the values do not depend on the parameter dtype), then cast."""
    out = torch.empty(shape, device=device, dtype=torch.float32)
    out.normal_(0.0, std, generator=gen)
    return out.to(dtype)


def embedding_tags(tied: bool) -> dict:
    """The tags of an embedding table, and of an LM head tied to it, that a parallelize plan sets: AdamW must not
    decay it (`no_weight_decay`, as nanoGPT and Megatron leave embeddings undecayed; norms and biases, 1-D, are
    never decayed: hybrid_engine/optim), and a tied copy is summed with its twin (`tied`)."""
    return {"no_weight_decay": True, **({"tied": TIED_EMBEDDINGS} if tied else {})}


def maybe_recompute(recompute: bool, fn, *args):
    """fn(*args), its activations recomputed in backward when `recompute` and a gradient is wanted: Megatron's
    selective recomputation of the attention core (Korthikanti et al. 2022), which keeps every other activation."""
    if recompute and torch.is_grad_enabled() and any(a.requires_grad for a in args if torch.is_tensor(a)):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all tokens, computed in fp32: logits [b, s, V], targets [b, s] int64."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def generate(model: nn.Sequential, prompt: torch.Tensor, new_tokens: int, temperature: float = 1.0,
             seed: int = 0) -> torch.Tensor:
    """Continue `prompt` (int64 [b, t]) by `new_tokens` tokens with a dense model (the whole Sequential in one
    process): sample from softmax(logits / temperature) with a generator seeded by `seed`, or take the argmax
    when temperature is 0. The context is cropped to the last `model[0].cfg.context` tokens (the longest sequence
    the model takes). Returns [b, t + new_tokens]."""
    context = model[0].cfg.context
    device = prompt.device
    gen = torch.Generator(device=device).manual_seed(seed)
    out = prompt
    for _ in range(new_tokens):
        logits = model(out[:, -context:])[:, -1].float()
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
        out = torch.cat([out, nxt], dim=1)
    return out
