"""Checkpoints written in this process without a process group: a one-rank stand-in for the engine that
checkpoint.save asks for, and a GPT checkpoint such as the driver writes (for python -m hybrid_engine.sample)."""
from __future__ import annotations

import hashlib
import json
import os
from types import SimpleNamespace

import torch

from hybrid_engine import checkpoint
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.parallelize import build_gpt
from hybrid_engine.models.gpt.workload import gpt_checkpoint_model


class OneRankEngine:
    """What checkpoint.save asks of an engine, for one rank that owns every parameter."""

    def __init__(self, weights: dict, optimizer: dict | None = None):
        self.weights, self.optimizer = weights, optimizer or {k: {} for k in weights}
        self.groups = SimpleNamespace(coords=SimpleNamespace(dp=0, cp=0, pp=0, mp=0))
        self.grid = SimpleNamespace(dp_size=1, pp_size=1, mp_size=1, order="mp-dp-pp")
        self.device, self.schedule_name, self.num_stages, self.pp_size = torch.device("cpu"), "1f1b", 1, 1

    def state_for_checkpoint(self) -> dict:
        return {"weights": self.weights, "optimizer": self.optimizer, "scaler": None}


SMALL_GPT = GPTConfig(vocab_size=256, layers=2, hidden=32, heads=2, seq_len=16)


def write_gpt_checkpoint(root, cfg: GPTConfig = SMALL_GPT, step: int = 1, run_info: dict | None = None) -> str:
    """root/step_N of a dense GPT of shape `cfg` (seeded weights), as one rank of the driver saves it."""
    weights = {k: v.detach().clone() for k, v in build_gpt(cfg).state_dict().items()}
    info = {"model": gpt_checkpoint_model(cfg), "optimizer": "sgd", **(run_info or {})}
    return checkpoint.save(OneRankEngine(weights), str(root), step, info)


def sha256_of(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def shards_match_their_checksums(step_dir) -> bool:
    """Every shard of checkpoint directory `step_dir` has the SHA-256 its manifest records."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        sums = json.load(f)["sha256"]
    return all(sha256_of(os.path.join(step_dir, name)) == digest for name, digest in sums.items())
