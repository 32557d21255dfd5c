"""Continue a prompt with a GPT checkpoint written on any grid, in one process:

    python -m hybrid_engine.sample --load CKPT --prompt "Once upon a time" [--tokens 200] [--temperature 0.8]

CKPT is a checkpoint directory (DIR/step_N) or a --save directory (its latest). The checkpoint stores every
parameter whole (gathered over MP, unpadded vocabulary) under the dense model's names ("<module index>.<name>"),
each in the shard the manifest names, and the model's shape in the manifest's "model" entry (the driver writes
`workloads.gpt_checkpoint_model(cfg)`: name "gpt", vocab_size, layers, hidden, heads, seq_len, tie_embeddings,
seed). So the dense GPT is rebuilt here and loaded directly, whatever dp x pp x mp wrote it.

Text: a vocabulary of 256 is bytes (UTF-8 in, bytes out, undecodable bytes shown as U+FFFD); any other vocabulary
needs `--tokenizer FILE` (the tokenizer.json that `python -m hybrid_engine.data prepare --bpe` keeps beside the
token file; needs the tokenizers package).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import torch
import torch.nn as nn

from .checkpoint import CheckpointError, open_checkpoint, read_shard
from .models.gpt import GPTConfig, build_gpt, generate
from .workloads import gpt_config_of


def read_weights(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the manifest's model entry, {parameter name: full tensor}) of a checkpoint, read in this process.

    The documented format (hybrid_engine/checkpoint.py): manifest["params"][name]["file"] names the shard (a
    torch.save'd dict) whose "weights"[name] holds the tensor. Raises CheckpointError (one line)."""
    ckpt = open_checkpoint(path)
    if ckpt.checksums is None:
        print(f"note: {ckpt.path} records no checksums (written before hybrid_engine recorded them): its shards "
              "are checked by size only", file=sys.stderr)
    weights: dict[str, torch.Tensor] = {}
    shards: dict[str, dict] = {}
    for name, entry in ckpt.manifest["params"].items():
        file = entry["file"]
        if file not in shards:  # each shard's checksum is checked before it is read
            shards[file] = read_shard(os.path.join(ckpt.path, file), (ckpt.checksums or {}).get(file))
        if name not in shards[file].get("weights", {}):
            raise CheckpointError(f"checkpoint {ckpt.path}: shard {file} does not hold {name}")
        weights[name] = shards[file]["weights"][name]
    return ckpt.manifest["model"], weights


def load_gpt(path: str) -> tuple[nn.Sequential, GPTConfig]:
    """The dense GPT of a checkpoint written on any grid, on the CPU, in eval mode."""
    model_info, weights = read_weights(path)
    try:
        cfg = gpt_config_of(model_info)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} does not hold a GPT ({exc})") from None
    model = build_gpt(cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not fit its GPT config: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return model.eval(), cfg


class Codec:
    """Text <-> token ids: bytes for a vocabulary of 256, else a tokenizers file."""

    def __init__(self, vocab_size: int, tokenizer: Optional[str] = None):
        self.tokenizer = None
        if tokenizer is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ValueError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
            try:
                self.tokenizer = Tokenizer.from_file(tokenizer)
            except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a missing or bad file
                raise ValueError(f"--tokenizer {tokenizer} cannot be read ({exc})") from None
            # A tokenizer of another vocabulary decodes the model's ids into other text, or drops them, silently.
            if self.tokenizer.get_vocab_size() != vocab_size:
                raise ValueError(f"--tokenizer {tokenizer} has a vocabulary of {self.tokenizer.get_vocab_size()}, "
                                 f"the checkpoint's model {vocab_size}: not the tokenizer of its token file")
        elif vocab_size != 256:
            raise ValueError(f"the checkpoint's vocabulary is {vocab_size}, not bytes (256): pass --tokenizer "
                             "FILE (the tokenizer.json beside its token file)")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids if self.tokenizer else list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer else bytes(ids).decode("utf-8", errors="replace")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.sample",
                                     description="Continue a prompt with a GPT checkpoint (any grid).")
    parser.add_argument("--load", required=True, metavar="CKPT", help="DIR/step_N, or a --save DIR (its latest)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--tokens", type=int, default=200, help="how many tokens to add (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json for a vocabulary other than bytes")
    args = parser.parse_args(argv)
    try:
        if args.tokens < 0 or args.temperature < 0:
            raise ValueError(f"--tokens and --temperature must be >= 0, got {args.tokens} and {args.temperature}")
        model, cfg = load_gpt(args.load)
        codec = Codec(cfg.vocab_size, args.tokenizer)
        prompt = codec.encode(args.prompt)
        if not prompt:
            raise ValueError("--prompt is empty")
        if max(prompt) >= cfg.vocab_size:
            raise ValueError(f"the prompt holds token {max(prompt)}, outside the vocabulary of {cfg.vocab_size}")
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
        out = generate(model, torch.tensor([prompt]), args.tokens, args.temperature, args.seed)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(codec.decode(out[0].tolist()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
