"""Token data for the GPT: a seeded Markov corpus, a text file (bytes), or a prepared token file (memmap).

    open_dataset(None, seq_len, seed)           the built-in corpus: a fixed random Markov chain over bytes
    open_dataset("book.txt", seq_len, seed)     any file without our header: its bytes, vocabulary 256
    open_dataset("book.tok", seq_len, seed)     a file made by `python -m hybrid_engine.data prepare IN OUT`

Every source ends up as one flat token array. Its last ~1 % (at least seq_len + 1 tokens) is held out for
validation; training windows of seq_len + 1 tokens start anywhere in the rest.

Grid invariance: row i of step t's batch starts at hash(seed, t, i) mod (number of training windows), a fixed
64-bit mix (splitmix64) -- no generator state, nothing that depends on the batch size or on which rows a rank
asks for. So a DP rank draws exactly its rows [start, stop) and they equal the same rows of the whole batch,
whatever the grid; a middle pipeline stage draws nothing. Validation batch i, row r is the held-out window
(i * batch_size + r) mod (number of windows): windows of seq_len + 1 tokens overlapping by one, so every
held-out token (but the first) is a target exactly once per pass.

Token file format (little-endian): a 32-byte header -- magic b"HEtokens", u32 version (1), u32 bytes per token
(2: uint16, 4: uint32), u64 vocabulary size, u64 token count -- then the tokens. `--bpe N` (needs the optional
`tokenizers` package) trains an N-token byte-level BPE on the input and keeps it as OUT.tokenizer.json.

Bad input raises DataError (a ValueError) with one line naming the file and what is wrong: missing, empty,
shorter than seq_len + 1 (or too short to also hold out seq_len + 1 tokens), a token id at or above the
vocabulary, a truncated header.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import struct
import sys
from typing import Optional, Sequence

import numpy as np
import torch

__all__ = [
    "DataError",
    "MarkovChain",
    "markov_corpus",
    "TokenDataset",
    "open_dataset",
    "load_tokens",
    "write_token_file",
    "prepare",
    "tokenizer_path",
    "MAGIC",
]

MAGIC = b"HEtokens"
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, bytes per token, vocabulary, count
_VERSION = 1
_DTYPES = {2: np.uint16, 4: np.uint32}
_STREAM_CHAIN, _STREAM_CORPUS, _STREAM_ROWS = 11, 12, 13
DEFAULT_VAL_FRACTION = 0.01
DEFAULT_MARKOV_TOKENS = 1 << 20


class DataError(ValueError):
    """Bad data input; the message is the one line the user sees."""


# ------------------------------------------------------------------------------------------------ Markov corpus


class MarkovChain:
    """A fixed random first-order Markov chain over `vocab` byte values, a function of the seed alone.

    State s moves to one of `successors` states: s+1 and s+2 (mod vocab: these make the chain irreducible and,
    with cycles of length vocab and vocab - 1, aperiodic, so it has one stationary distribution) and
    successors - 2 others drawn at random. Transition probabilities are Dirichlet(0.5) draws rounded to
    multiples of 1 / quantum, so they are exact and sampling is a table lookup. The entropy rate
    H = sum_s pi(s) H(P(. | s)) is the lowest mean next-token loss any model can reach on its output.
    """

    def __init__(self, seed: int, vocab: int = 256, successors: int = 4, quantum: int = 1024):
        if not 3 <= successors <= vocab:
            raise ValueError(f"successors must be in [3, {vocab}], got {successors}")
        self.seed, self.vocab, self.quantum = seed, vocab, quantum
        rng = np.random.default_rng([seed, _STREAM_CHAIN])
        self.next_states = np.empty((vocab, successors), dtype=np.int64)
        self.counts = np.empty((vocab, successors), dtype=np.int64)
        for s in range(vocab):
            others = np.setdiff1d(np.arange(vocab), [(s + 1) % vocab, (s + 2) % vocab])
            extra = rng.choice(others, size=successors - 2, replace=False)
            self.next_states[s] = np.concatenate([[(s + 1) % vocab, (s + 2) % vocab], np.sort(extra)])
            p = rng.dirichlet(np.full(successors, 0.5))
            counts = np.maximum(1, np.round(p * quantum)).astype(np.int64)
            counts[np.argmax(counts)] += quantum - counts.sum()
            self.counts[s] = counts
        self.probs = self.counts / quantum
        self.matrix = np.zeros((vocab, vocab))
        for s in range(vocab):
            self.matrix[s, self.next_states[s]] = self.probs[s]
        # Lookup table: next state = table[s * quantum + u], u uniform in [0, quantum).
        self._table = np.repeat(self.next_states.reshape(-1), self.counts.reshape(-1)).tolist()

    @functools.cached_property
    def stationary(self) -> np.ndarray:
        """pi with pi P = pi, sum 1 (a least-squares solve of the linear system, float64)."""
        a = np.vstack([self.matrix.T - np.eye(self.vocab), np.ones((1, self.vocab))])
        b = np.zeros(self.vocab + 1)
        b[-1] = 1.0
        pi = np.linalg.lstsq(a, b, rcond=None)[0]
        return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()

    def entropy_rate_nats(self) -> float:
        """Entropy rate in nats per token: the floor of the mean next-token cross-entropy."""
        h = -(self.probs * np.log(self.probs)).sum(axis=1)
        return float(self.stationary @ h)

    def entropy_rate_bits(self) -> float:
        return self.entropy_rate_nats() / math.log(2)

    def nll_nats(self, tokens: np.ndarray) -> float:
        """Mean -log P(x[t+1] | x[t]) of a sequence under this chain: the best possible loss on exactly it."""
        tokens = np.asarray(tokens, dtype=np.int64)
        p = self.matrix[tokens[:-1], tokens[1:]]
        if np.any(p == 0):
            raise ValueError("the sequence has a transition this chain never makes")
        return float(-np.log(p).mean())

    def sample(self, n: int, seed: int) -> np.ndarray:
        """n tokens (uint8 for vocab <= 256), the first drawn from the stationary distribution."""
        rng = np.random.default_rng([seed, _STREAM_CORPUS])
        state = int(rng.choice(self.vocab, p=self.stationary))
        draws = rng.integers(0, self.quantum, size=max(0, n - 1)).tolist()
        table, q = self._table, self.quantum
        out = [state]
        append = out.append
        for u in draws:  # ~0.5 us a token; 1M tokens in about half a second
            state = table[state * q + u]
            append(state)
        return np.asarray(out, dtype=np.uint8 if self.vocab <= 256 else np.uint32)


@functools.lru_cache(maxsize=4)
def markov_corpus(seed: int, tokens: int = DEFAULT_MARKOV_TOKENS) -> tuple[np.ndarray, MarkovChain]:
    """(the built-in corpus of `tokens` byte tokens, the chain that made it); cached per process."""
    chain = MarkovChain(seed)
    corpus = chain.sample(tokens, seed)
    corpus.flags.writeable = False
    return corpus, chain


# ------------------------------------------------------------------------------------------------ files


def tokenizer_path(token_file: str) -> str:
    """Where `prepare --bpe` keeps the tokenizer of a token file."""
    return f"{token_file}.tokenizer.json"


def _check_file(path: str) -> int:
    if not os.path.exists(path):
        raise DataError(f"data file {path} does not exist")
    if not os.path.isfile(path):
        raise DataError(f"data file {path} is not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"data file {path} is empty")
    return size


def load_tokens(path: str, check_ids: bool = True) -> tuple[np.ndarray, int]:
    """(tokens as a read-only memmap, vocabulary size) of a token file, or of any other file as bytes (256)."""
    size = _check_file(path)
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
    if not head.startswith(MAGIC):
        return np.memmap(path, dtype=np.uint8, mode="r"), 256
    if len(head) < _HEADER.size:
        raise DataError(f"token file {path} has a truncated header ({len(head)} of {_HEADER.size} bytes)")
    _, version, width, vocab, count = _HEADER.unpack(head)
    if version != _VERSION or width not in _DTYPES:
        raise DataError(f"token file {path} has version {version} and {width} bytes per token; this reader "
                        f"knows version {_VERSION} with 2 or 4")
    if vocab < 1 or vocab > (1 << (8 * width)):
        raise DataError(f"token file {path} names vocabulary {vocab}, impossible with {width}-byte tokens")
    if count == 0:
        raise DataError(f"token file {path} is empty (its header counts 0 tokens)")
    if size < _HEADER.size + count * width:
        raise DataError(f"token file {path} is truncated: its header counts {count} tokens, the file holds "
                        f"{(size - _HEADER.size) // width}")
    tokens = np.memmap(path, dtype=_DTYPES[width], mode="r", offset=_HEADER.size, shape=(count,))
    if check_ids:
        top = max(int(tokens[i : i + (1 << 24)].max()) for i in range(0, count, 1 << 24))
        if top >= vocab:
            raise DataError(f"token file {path} holds token id {top}, at or above its vocabulary size {vocab}")
    return tokens, int(vocab)


def write_token_file(path: str, tokens: np.ndarray, vocab_size: int) -> None:
    """Write tokens (< vocab_size) with the header; uint16 when the vocabulary fits, else uint32. Atomic."""
    tokens = np.asarray(tokens)
    if tokens.size == 0:
        raise DataError(f"refusing to write {path}: no tokens")
    top = int(tokens.max())
    if top >= vocab_size or int(tokens.min()) < 0:
        raise DataError(f"refusing to write {path}: token id {top} is outside vocabulary {vocab_size}")
    width = 2 if vocab_size <= (1 << 16) else 4
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(_HEADER.pack(MAGIC, _VERSION, width, vocab_size, tokens.size))
        tokens.astype(_DTYPES[width]).tofile(f)
    os.replace(tmp, path)


def _train_bpe(text_path: str, vocab_size: int, out_json: str):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise DataError("--bpe needs the tokenizers package: pip install tokenizers") from None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tokenizer.train([text_path], trainer)
    tokenizer.save(out_json)
    return tokenizer


def prepare(in_path: str, out_path: str, bpe: Optional[int] = None) -> tuple[int, int]:
    """Tokenize `in_path` into a token file at `out_path`: bytes (vocabulary 256), or an N-token BPE trained on
    the input (saved beside it, see tokenizer_path). Returns (token count, vocabulary size)."""
    _check_file(in_path)
    if bpe is None:
        tokens = np.fromfile(in_path, dtype=np.uint8)
        write_token_file(out_path, tokens, 256)
        return tokens.size, 256
    if bpe < 257:
        raise DataError(f"--bpe {bpe}: a byte-level BPE needs a vocabulary of at least 257 (256 bytes + merges)")
    tokenizer = _train_bpe(in_path, bpe, tokenizer_path(out_path))
    chunks: list[np.ndarray] = []
    with open(in_path, "r", encoding="utf-8", errors="replace", newline="") as f:
        while lines := list(itertools.islice(f, 4096)):  # streamed: the text is never all in memory
            ids = [i for enc in tokenizer.encode_batch(lines) for i in enc.ids]
            chunks.append(np.asarray(ids, dtype=np.uint32))
    vocab = tokenizer.get_vocab_size()
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint32)
    write_token_file(out_path, tokens, vocab)
    return tokens.size, vocab


# ------------------------------------------------------------------------------------------------ the dataset


_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arrays; wrapping arithmetic is the point)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _row_hash(seed: int, step: int, rows: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & (2**64 - 1)], dtype=np.uint64) + _GOLD)
        key = _mix(key ^ (np.uint64(step & (2**64 - 1)) * _GOLD + np.uint64(_STREAM_ROWS)))
        return _mix(key ^ (rows.astype(np.uint64) * _GOLD + np.uint64(1)))


class TokenDataset:
    """Windows of seq_len + 1 tokens of one flat token array: inputs are the first seq_len, targets the last.

    `batch(step, batch_size, start, stop)` gives rows [start, stop) of step `step`'s global batch (the same
    numbers on every grid, see the module docstring); `val_batch(i, ...)` the same for held-out windows.
    """

    def __init__(self, tokens: np.ndarray, vocab_size: int, seq_len: int, seed: int,
                 val_fraction: float = DEFAULT_VAL_FRACTION, name: str = "tokens", source: object = None):
        if seq_len < 1:
            raise DataError(f"seq_len must be >= 1, got {seq_len}")
        if not 0.0 <= val_fraction < 1.0:
            raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
        n = len(tokens)
        if n < seq_len + 1:
            raise DataError(f"data {name} holds {n} tokens, shorter than seq_len + 1 = {seq_len + 1}")
        held_out = max(seq_len + 1, math.ceil(n * val_fraction)) if val_fraction > 0 else 0
        if n - held_out < seq_len + 1:
            raise DataError(f"data {name} holds {n} tokens, too few to train on seq_len + 1 = {seq_len + 1} and "
                            f"hold out {held_out} for validation: it needs at least {seq_len + 1 + held_out}")
        self.tokens, self.vocab_size, self.seq_len, self.seed = tokens, int(vocab_size), seq_len, seed
        self.name, self.source = name, source
        self.train_tokens = n - held_out
        self.val_tokens = held_out
        self.train_windows = self.train_tokens - seq_len  # window starts 0 .. train_tokens - seq_len - 1
        self.val_windows = (held_out - 1) // seq_len if held_out else 0
        self._span = np.arange(seq_len + 1, dtype=np.int64)

    def __repr__(self) -> str:
        return (f"TokenDataset({self.name}: {len(self.tokens)} tokens, vocabulary {self.vocab_size}, seq_len "
                f"{self.seq_len}, {self.train_tokens} for training, {self.val_tokens} held out)")

    def train_offsets(self, step: int, start: int, stop: int) -> np.ndarray:
        """Start positions of rows [start, stop) of step `step`."""
        if stop <= start or start < 0:
            raise ValueError(f"empty row range [{start}, {stop})")
        rows = np.arange(start, stop, dtype=np.int64)
        return (_row_hash(self.seed, step, rows) % np.uint64(self.train_windows)).astype(np.int64)

    def val_offsets(self, index: int, batch_size: int, start: int, stop: int) -> np.ndarray:
        if not self.val_windows:
            raise DataError(f"data {self.name} holds nothing out for validation (val_fraction 0)")
        if stop <= start or start < 0:
            raise ValueError(f"empty row range [{start}, {stop})")
        windows = (index * batch_size + np.arange(start, stop, dtype=np.int64)) % self.val_windows
        return self.train_tokens + windows * self.seq_len

    def _windows(self, offsets: np.ndarray, inputs: bool, targets: bool, device) -> tuple:
        block = np.asarray(self.tokens[offsets[:, None] + self._span], dtype=np.int64)
        window = torch.from_numpy(block).to(device)
        return (window[:, :-1].contiguous() if inputs else None, window[:, 1:].contiguous() if targets else None)

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             device: torch.device | str = "cpu") -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(inputs, targets) int64 [stop - start, seq_len] of rows [start, stop) of step `step`, each only if
        asked for (else None): the first stage needs inputs, the last targets."""
        return self._windows(self.train_offsets(step, start, stop), inputs, targets, device)

    def batch(self, step: int, batch_size: int, start: int = 0, stop: Optional[int] = None,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of rows [start, stop) (default: all) of step `step`'s global batch of batch_size
        rows. A row's tokens do not depend on batch_size; it only bounds the rows."""
        stop = batch_size if stop is None else stop
        if stop > batch_size:
            raise ValueError(f"rows [{start}, {stop}) outside a batch of {batch_size}")
        return self.draw(step, start, stop, device=device)

    def val_batch(self, index: int, batch_size: int, start: int = 0, stop: Optional[int] = None,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [start, stop) of validation batch `index` (batch_size rows); ceil(val_windows / batch_size)
        batches cover the held-out tokens once."""
        stop = batch_size if stop is None else stop
        return self._windows(self.val_offsets(index, batch_size, start, stop), True, True, device)

    def val_batches(self, batch_size: int) -> int:
        """How many validation batches of batch_size rows cover every held-out window at least once."""
        return -(-self.val_windows // batch_size)


def open_dataset(path: Optional[str], seq_len: int, seed: int, val_fraction: float = DEFAULT_VAL_FRACTION,
                 markov_tokens: int = DEFAULT_MARKOV_TOKENS) -> TokenDataset:
    """The run's data: the built-in Markov corpus when `path` is None (`.source` is its MarkovChain, for the
    entropy floor), else a token file or a text file (see the module docstring)."""
    if path is None:
        corpus, chain = markov_corpus(seed, markov_tokens)
        return TokenDataset(corpus, 256, seq_len, seed, val_fraction, name=f"markov(seed={seed})", source=chain)
    tokens, vocab = load_tokens(path)
    return TokenDataset(tokens, vocab, seq_len, seed, val_fraction, name=path)


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.data",
                                     description="Prepare token files for the GPT (see hybrid_engine/data.py).")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize a text file into a memory-mapped token file")
    prep.add_argument("input")
    prep.add_argument("output")
    prep.add_argument("--bpe", type=int, default=None, metavar="N",
                      help="train an N-token byte-level BPE (needs: pip install tokenizers); default: bytes")
    info = sub.add_parser("info", help="describe a data file")
    info.add_argument("path")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            count, vocab = prepare(args.input, args.output, args.bpe)
            extra = f", tokenizer {tokenizer_path(args.output)}" if args.bpe else ""
            print(f"wrote {args.output}: {count} tokens, vocabulary {vocab}{extra}")
        else:
            tokens, vocab = load_tokens(args.path)
            kind = "token file" if isinstance(tokens, np.memmap) and tokens.dtype != np.uint8 else "bytes"
            print(f"{args.path}: {kind}, {len(tokens)} tokens, vocabulary {vocab}")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
