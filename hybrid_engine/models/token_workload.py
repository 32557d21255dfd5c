"""What the token models' workloads (models/gpt, models/llama) share: the data they train on, opened and checked
with one line per problem, the rule that every pipeline stage holds a layer, whether the weights can fit at all,
and what a checkpoint records of the data."""
from __future__ import annotations

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.data import DataError, TokenDataset, load_tokens, open_dataset

from hybrid_engine.parallel.context.chunks import check_sequence

from .memory_estimate import refuse_if_too_large

BUILTIN_VOCAB = 256  # the built-in Markov corpus's


def open_token_data(data: str | TokenDataset | None, seq_len: int, seed: int) -> TokenDataset:
    """`data` as a TokenDataset of seq_len + 1 token windows: a text or token file path, a ready dataset (its
    seq_len must be this one), or None for the built-in Markov corpus of `seed`."""
    if isinstance(data, TokenDataset):
        if data.seq_len != seq_len:
            raise ConfigError(f"the dataset's seq_len {data.seq_len} differs from the model's {seq_len}")
        return data
    try:
        return open_dataset(data, seq_len, seed)
    except DataError as exc:
        raise ConfigError(str(exc)) from None


def data_vocab(path: str | None, seq_len: int) -> int:
    """The vocabulary of a data file that must exist, be non-empty, hold at least seq_len + 1 tokens (plus the
    held-out part) and no token id at or above its vocabulary; None: the built-in corpus's."""
    if path is None:
        return BUILTIN_VOCAB
    try:
        tokens, vocab = load_tokens(path)
        TokenDataset(tokens, vocab, seq_len, 0, name=path)
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    return vocab


def check_stage_count(model: str, layers: int, stages: int) -> None:
    """Every pipeline stage (pp x virtual stages) must hold at least one of the model's layers + 2 modules."""
    if layers + 2 < stages:
        raise ConfigError(f"the {model} has {layers + 2} layers (embedding, {layers} blocks, head) but the pipeline "
                          f"needs at least one per stage (pp x virtual stages = {stages})")


def refuse_if_weights_too_large(what: str, nbytes: int, device_type: str) -> None:
    too_large = refuse_if_too_large(what, nbytes, device_type, " per rank")
    if too_large:
        raise ConfigError(f"{too_large}: smaller flags, more --pp/--mp, or (a vocabulary this large) a damaged "
                          "token file")


def checkpoint_data(data: TokenDataset) -> dict:
    """run_info["data"]: what a checkpoint records of the data it was trained on."""
    return {"name": data.name, "tokens": len(data.tokens), "vocab_size": data.vocab_size,
            "fingerprint": data.fingerprint, "tokenizer_sha256": data.tokenizer_sha256}


def check_context_split(options, grid) -> None:
    """--cp's rules, before any collective: a model of token sequences (options with seq_len), cut into 2 cp equal
    chunks, and under sequence parallelism each rank's tokens split evenly over MP."""
    cp = grid.cp_size
    if cp == 1:
        return
    seq_len = getattr(options, "seq_len", None)
    if seq_len is None:
        raise ConfigError(f"--cp {cp} splits sequences: it applies to the token models (gpt, llama) only")
    problem = check_sequence(seq_len, cp)
    if problem:
        raise ConfigError(problem)
    if getattr(options, "sequence_parallel", False) and (seq_len // cp) % grid.mp_size:
        raise ConfigError(f"--sequence-parallel with --cp {cp}: the {seq_len // cp} tokens per cp rank are not "
                          f"divisible by --mp {grid.mp_size}")
