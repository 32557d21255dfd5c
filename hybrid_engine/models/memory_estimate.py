"""Will a model's weights fit at all? Answered from its shape alone, before anything is allocated.

A damaged or crafted description (a checkpoint manifest saying 10^7 layers of hidden 2^20, a token file whose
header claims a vocabulary of 2^32) would otherwise be built until memory runs out, or fail deep in torch with
an allocator's message. The estimate is a lower bound (fp32 weights only: no gradients, optimizer state or
activations), so refusing what exceeds the machine's memory never refuses a model that could have run.
"""
from __future__ import annotations

import os

import torch

from hybrid_engine.models.gpt.flops import gpt_param_count
from hybrid_engine.models.gpt.model import GPTConfig

FP32_BYTES = 4


def memory_bytes(device_type: str = "cpu") -> int:
    """All the memory one rank could ever have: a GPU's (CUDA) or this machine's physical memory (CPU)."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes < 2**40 else f"{nbytes / 2**40:,.1f} TiB"


def weight_bytes(params: int, vocab: int, hidden: int, pp: int = 1, mp: int = 1) -> int:
    """A lower bound on one rank's fp32 weights: the whole model (`params`) split evenly over pp x mp ranks, and
    at least the token embedding's share on the first stage (split over mp only)."""
    return FP32_BYTES * max(params // (pp * mp), vocab * hidden // mp)


def gpt_weight_bytes(cfg: GPTConfig, pp: int = 1, mp: int = 1) -> int:
    """weight_bytes of a GPT."""
    return weight_bytes(gpt_param_count(cfg), cfg.vocab_size, cfg.hidden, pp, mp)


def refuse_if_too_large(what: str, nbytes: int, device_type: str = "cpu", where: str = "") -> str | None:
    """The reason `what` (e.g. 'the GPT of checkpoint X') cannot fit, or None when it might; `where` qualifies
    the bytes (' per rank')."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return None  # planning for a GPU card from another machine: the planner's memory model judges that card
    available = memory_bytes(device_type)
    if nbytes <= available:
        return None
    memory = "this GPU's memory" if device_type == "cuda" else "this machine's memory"
    return f"{what} needs at least {gib(nbytes)} of fp32 weights{where}, more than {memory} ({gib(available)})"
