"""Continue a prompt with a checkpoint written on any grid (or imported), in one process, of a model whose registry
entry has a sampler (the GPT, the Llama: models/registry.py):

    python -m hybrid_engine.sample --load CKPT --prompt "Once upon a time" [--tokens 200] [--temperature 0.8]
    python -m hybrid_engine.sample --load CKPT --prompt-ids 1,2,3 --temperature 0      (token ids in and out)

CKPT is a checkpoint directory (DIR/step_N) or a --save directory (its latest). The checkpoint stores every
parameter whole (gathered over MP, unpadded vocabulary) under the dense model's names ("<module index>.<name>"),
each in the shard the manifest names, and the model's shape in the manifest's "model" entry (the driver writes
`models.gpt.workload.gpt_checkpoint_model(cfg)`: name "gpt", vocab_size, layers, hidden, heads, seq_len, tie_embeddings,
seed; a Llama's is models.llama.workload.llama_checkpoint_model). So the dense model is rebuilt here and loaded
directly, whatever dp x pp x mp wrote it.

Before anything is built, the model entry must describe a model whose weights fit this machine's memory and whose
every parameter has the shape the manifest records (a crafted or damaged manifest is one line, not a build until
memory runs out or a load_state_dict traceback); every shard's checksum is checked before it is read.

Text: a vocabulary of 256 is bytes (UTF-8 in, bytes out, undecodable bytes shown as U+FFFD); any other vocabulary
needs `--tokenizer FILE` (the tokenizer.json that `python -m hybrid_engine.data prepare --bpe` keeps beside the
token file, or a Hugging Face model directory holding one; needs the tokenizers package). When the checkpoint
records the SHA-256 of the tokenizer its token file was made with, --tokenizer must be that file: another one of
the same size decodes the ids into other text. `--prompt-ids` needs no tokenizer: ids in, ids out.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
from typing import Optional, Sequence

import torch
import torch.nn as nn

from hybrid_engine.checkpoint import CheckpointError, open_checkpoint, read_shard
from hybrid_engine.config.engine import ConfigError
from hybrid_engine.config.input_files import read_regular_file
from hybrid_engine.models import registry
from hybrid_engine.models.decoder import generate
from hybrid_engine.models.entry import ModelEntry
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.memory_estimate import refuse_if_too_large

MAX_SIZE = 2**16  # layers, hidden, heads, seq_len: the training flags' limit
MAX_VOCAB = 2**32  # a token file's 4-byte ids
MAX_TOKENIZER_BYTES = 1 << 30


def _model_config(ckpt) -> tuple[ModelEntry, object]:
    """(the registry entry of the model the manifest's model entry names, its config), checked to be one that can
    be built here at all."""
    model = ckpt.manifest["model"]
    found = registry.of_checkpoint(model)
    if found is None or found[1].sampler is None:
        what = (f"the {found[1].title} (--model {found[0]})" if found else
                f"a model named {model.get('name') if isinstance(model, dict) else None!r}")
        able = [(n, registry.entry(n)) for n in registry.names() if registry.entry(n).sampler]
        raise CheckpointError(f"checkpoint {ckpt.path} holds {what}, not {' or '.join('a ' + e.title for _, e in able)}"
                              f": sample continues text with a checkpoint of "
                              f"{' or '.join('--model ' + n for n, _ in able)}")
    entry = found[1]
    what = entry.title
    try:
        cfg = entry.sampler.config_of(model)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {ckpt.path} does not hold a {what} ({exc})") from None
    for name, limit in (("layers", MAX_SIZE), ("hidden", MAX_SIZE), ("heads", MAX_SIZE), ("seq_len", MAX_SIZE),
                        ("vocab_size", MAX_VOCAB)):
        if getattr(cfg, name) > limit:
            raise CheckpointError(f"checkpoint {ckpt.path} describes a {what} of {name} {getattr(cfg, name)}, more "
                                  f"than {limit}: damaged, or not written by hybrid_engine")
    too_large = refuse_if_too_large(f"the {what} of checkpoint {ckpt.path} ({cfg.layers} layers, hidden {cfg.hidden}, "
                                    f"vocabulary {cfg.vocab_size})", entry.sampler.weight_bytes(cfg))
    if too_large:
        raise CheckpointError(f"{too_large}: damaged, or too large to sample from here")
    return entry, cfg


def _check_shapes(ckpt, entry: ModelEntry, cfg) -> None:
    """Every parameter of the model `cfg` must be in the manifest with the shape it has there (a model entry that
    disagrees with the weights: a crafted vocabulary or seq_len)."""
    expected = {k: list(v.shape) for k, v in entry.sampler.build(cfg, "meta").state_dict().items()}
    recorded = {k: v["shape"] for k, v in ckpt.manifest["params"].items()}
    what = entry.title
    for name, shape in expected.items():
        if recorded.get(name) != shape:
            there = f"is {recorded[name]} there" if name in recorded else "is missing there"
            raise CheckpointError(f"checkpoint {ckpt.path} does not fit its {what} config: parameter {name} {there}, "
                                  f"{shape} for the model entry's vocab_size {cfg.vocab_size}, hidden {cfg.hidden}, "
                                  f"seq_len {cfg.seq_len}: damaged, or not written by hybrid_engine")
    extra = sorted(set(recorded) - set(expected))
    if extra:
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit its {what} config: it holds {extra[0]}, which "
                              "that model has not: damaged, or not written by hybrid_engine")


def load_checked(path: str) -> tuple[nn.Sequential, object, dict]:
    """(the dense model of a checkpoint written on any grid, on the CPU, in eval mode; its config; the manifest)."""
    ckpt = open_checkpoint(path)
    model_entry, cfg = _model_config(ckpt)
    _check_shapes(ckpt, model_entry, cfg)
    if ckpt.checksums is None:
        print(f"note: {ckpt.path} records no checksums (written before hybrid_engine recorded them): its shards "
              "are checked by size only", file=sys.stderr)
    weights: dict[str, torch.Tensor] = {}
    shards: dict[str, dict] = {}
    for name, entry in ckpt.manifest["params"].items():
        file = entry["file"]
        if file not in shards:  # each shard's checksum is checked before it is read
            shards[file] = read_shard(os.path.join(ckpt.path, file), (ckpt.checksums or {}).get(file))
        weight = shards[file].get("weights", {}).get(name)
        if not torch.is_tensor(weight) or list(weight.shape) != entry["shape"]:
            raise CheckpointError(f"checkpoint {ckpt.path}: shard {file} does not hold {name} of shape "
                                  f"{entry['shape']}: damaged, or not written by hybrid_engine")
        weights[name] = weight
    model = model_entry.sampler.build(cfg, "cpu")
    model.load_state_dict(weights, strict=True)  # names and shapes were checked above
    return model.eval(), cfg, ckpt.manifest


def load_gpt(path: str) -> tuple[nn.Sequential, GPTConfig]:
    """The dense GPT of a checkpoint written on any grid, on the CPU, in eval mode."""
    model, cfg, _ = load_checked(path)
    return model, cfg


class Codec:
    """Text <-> token ids: bytes for a vocabulary of 256, else a tokenizers file (given as its bytes)."""

    def __init__(self, vocab_size: int, tokenizer: Optional[str] = None, tokenizer_json: bytes | None = None,
                 expected_sha256: str | None = None, padded_vocab: bool = False):
        self.tokenizer = None
        if tokenizer is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ValueError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
            try:
                self.tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
            except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad file
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ValueError(f"--tokenizer {tokenizer} cannot be read ({first})") from None
            # A tokenizer of another vocabulary decodes the model's ids into other text, or drops them, silently
            # (a model whose vocabulary is its own, not its data's, may be padded past its tokenizer's).
            size = self.tokenizer.get_vocab_size()
            if size > vocab_size or (size < vocab_size and not padded_vocab):
                raise ValueError(f"--tokenizer {tokenizer} has a vocabulary of {self.tokenizer.get_vocab_size()}, "
                                 f"the checkpoint's model {vocab_size}: not the tokenizer of its token file")
            # ... and so does one of the same size with other merges.
            if expected_sha256 is not None and hashlib.sha256(tokenizer_json).hexdigest() != expected_sha256:
                raise ValueError(f"--tokenizer {tokenizer} is not the tokenizer of the token file this checkpoint was "
                                 "trained on (its SHA-256 differs from the one the token file recorded): it would "
                                 "decode the model's ids into other text")
        elif vocab_size != 256:
            raise ValueError(f"the checkpoint's vocabulary is {vocab_size}, not bytes (256): pass --tokenizer "
                             "FILE (the tokenizer.json beside its token file)")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids if self.tokenizer else list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer else bytes(ids).decode("utf-8", errors="replace")


MAX_NEW_TOKENS = 2**20  # a model's forward per token: a million is hours on a CPU already


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.sample",
                                     description="Continue a prompt with a GPT or Llama checkpoint (any grid).")
    parser.add_argument("--load", required=True, metavar="CKPT", help="DIR/step_N, or a --save DIR (its latest)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the text to continue")
    source.add_argument("--prompt-ids", metavar="IDS",
                        help="token ids to continue, comma-separated (e.g. 1,2,3): ids in, ids out, no tokenizer")
    parser.add_argument("--tokens", type=int, default=200, help="how many tokens to add (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json (or a Hugging Face model directory holding "
                        "one) for a vocabulary other than bytes")
    args = parser.parse_args(argv)
    try:
        if args.tokens < 0 or not (math.isfinite(args.temperature) and args.temperature >= 0):
            raise ValueError(f"--tokens must be >= 0 and --temperature a finite number >= 0, got {args.tokens} and "
                             f"{args.temperature}")
        if args.tokens > MAX_NEW_TOKENS:  # one forward each: before the checkpoint is read, not hours into it
            raise ValueError(f"--tokens {args.tokens} is too large (at most {MAX_NEW_TOKENS} a call)")
        tokenizer = args.tokenizer
        if tokenizer is not None and os.path.isdir(tokenizer):  # a Hugging Face model directory
            tokenizer = os.path.join(tokenizer, "tokenizer.json")
        tokenizer_json = (read_regular_file(tokenizer, MAX_TOKENIZER_BYTES, f"--tokenizer {tokenizer}",
                                            "{said} cannot be read ({why})")
                          if tokenizer is not None and args.prompt is not None else None)  # a FIFO is refused
        model, cfg, manifest = load_checked(args.load)
        data = manifest.get("data") if isinstance(manifest.get("data"), dict) else None
        recorded = data.get("tokenizer_sha256") if data else None
        if args.prompt_ids is not None:
            codec, prompt = None, _ids(args.prompt_ids)
        else:
            codec = Codec(cfg.vocab_size, tokenizer, tokenizer_json, recorded,
                          padded_vocab=registry.of_checkpoint(manifest["model"])[1].sampler.padded_vocab)
            if tokenizer is not None and recorded is None:
                why = ("its token file predates them" if data else "it was trained on no token file: an import")
                print(f"note: {args.load} records no tokenizer checksum ({why}): --tokenizer {tokenizer} is trusted "
                      "to be its tokenizer", file=sys.stderr)
            prompt = codec.encode(args.prompt)
        if not prompt:
            raise ValueError("--prompt is empty")
        if max(prompt) >= cfg.vocab_size:
            raise ValueError(f"the prompt holds token {max(prompt)}, outside the vocabulary of {cfg.vocab_size}")
        _cap_threads(model)
        out = generate(model, torch.tensor([prompt]), args.tokens, args.temperature, args.seed)
    except (CheckpointError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ids = out[0].tolist()
    print(",".join(map(str, ids)) if codec is None else codec.decode(ids), flush=True)
    return 0


PARAMETERS_PER_THREAD = 16_000_000


def _cap_threads(model: nn.Module) -> None:
    """One sequence decodes a token at a time: a small model's kernels are too short to share between threads,
    whose hand-offs then cost more than they save (and much more on a busy machine), so a thread per 16M
    parameters, at most 4 and the cores'. OMP_NUM_THREADS, when set, is the user's choice and stands."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    parameters = sum(p.numel() for p in model.parameters())
    threads = max(1, min(4, torch.get_num_threads(), parameters // PARAMETERS_PER_THREAD))
    torch.set_num_threads(threads)
    print(f"sample: {threads} CPU thread{'s' if threads > 1 else ''} for {parameters / 1e6:.1f}M parameters "
          "(OMP_NUM_THREADS=N sets it)", file=sys.stderr)


def _ids(text: str) -> list[int]:
    """--prompt-ids: comma-separated non-negative token ids."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--prompt-ids takes comma-separated token ids (e.g. 1,2,3), got {text!r}") from None
    if any(i < 0 for i in ids):
        raise ValueError(f"--prompt-ids holds a negative id: {text!r}")
    return ids


if __name__ == "__main__":
    sys.exit(main())
