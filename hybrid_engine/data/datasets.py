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

Token files (a header, then uint16 or uint32 tokens) are data/token_files.py's; `python -m hybrid_engine.data
prepare` (data/prepare.py) writes them, with `--bpe N` (needs the optional `tokenizers` package) an N-token
byte-level BPE trained on the input, kept as OUT.tokenizer.json and named by its SHA-256 in the header.

Bad input raises DataError (a ValueError) with one line naming the file and what is wrong: missing, empty,
shorter than seq_len + 1 (or too short to also hold out seq_len + 1 tokens), a token id at or above the
vocabulary, a truncated or damaged header.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
import torch

from hybrid_engine.parallel.context.chunks import positions

from .token_files import DataError, fingerprint, load_tokens, read_header


_STREAM_CHAIN, _STREAM_CORPUS, _STREAM_ROWS = 11, 12, 13
DEFAULT_VAL_FRACTION = 0.01
DEFAULT_MARKOV_TOKENS = 1 << 20


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
                 val_fraction: float = DEFAULT_VAL_FRACTION, name: str = "tokens", source: object = None,
                 tokenizer_sha256: str | None = None):
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
        self.name, self.source, self.tokenizer_sha256 = name, source, tokenizer_sha256
        self.train_tokens = n - held_out
        self.val_tokens = held_out
        self.train_windows = self.train_tokens - seq_len  # window starts 0 .. train_tokens - seq_len - 1
        self.val_windows = (held_out - 1) // seq_len if held_out else 0
        self._span = np.arange(seq_len + 1, dtype=np.int64)

    def __repr__(self) -> str:
        return (f"TokenDataset({self.name}: {len(self.tokens)} tokens, vocabulary {self.vocab_size}, seq_len "
                f"{self.seq_len}, {self.train_tokens} for training, {self.val_tokens} held out)")

    @functools.cached_property
    def fingerprint(self) -> str:
        """Tells this data from other data (token_files.fingerprint); a checkpoint records it."""
        return fingerprint(self.tokens, self.vocab_size)

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

    def _windows(self, offsets: np.ndarray, inputs: bool, targets: bool, device,
                 chunks: tuple[int, int] = (0, 1)) -> tuple:
        if chunks[1] > 1:  # a context-parallel rank reads its chunks' tokens only
            where = offsets[:, None] + positions(self.seq_len, *chunks).numpy()
            return tuple(torch.from_numpy(np.asarray(self.tokens[where + shift], dtype=np.int64)).to(device)
                         if wanted else None for wanted, shift in ((inputs, 0), (targets, 1)))
        block = np.asarray(self.tokens[offsets[:, None] + self._span], dtype=np.int64)
        window = torch.from_numpy(block).to(device)
        return (window[:, :-1].contiguous() if inputs else None, window[:, 1:].contiguous() if targets else None)

    def draw(self, step: int, start: int, stop: int, *, inputs: bool = True, targets: bool = True,
             device: torch.device | str = "cpu",
             chunks: tuple[int, int] = (0, 1)) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(inputs, targets) int64 [stop - start, seq_len] of rows [start, stop) of step `step`, each only if
        asked for (else None): the first stage needs inputs, the last targets. chunks (cp rank, cp): that
        context-parallel rank's tokens of each row only (parallel/context/chunks.py), [rows, seq_len / cp]."""
        return self._windows(self.train_offsets(step, start, stop), inputs, targets, device, chunks)

    def batch(self, step: int, batch_size: int, start: int = 0, stop: Optional[int] = None,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of rows [start, stop) (default: all) of step `step`'s global batch of batch_size
        rows. A row's tokens do not depend on batch_size; it only bounds the rows."""
        stop = batch_size if stop is None else stop
        if stop > batch_size:
            raise ValueError(f"rows [{start}, {stop}) outside a batch of {batch_size}")
        return self.draw(step, start, stop, device=device)

    def val_batch(self, index: int, batch_size: int, start: int = 0, stop: Optional[int] = None,
                  device: torch.device | str = "cpu",
                  chunks: tuple[int, int] = (0, 1)) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [start, stop) of validation batch `index` (batch_size rows); ceil(val_windows / batch_size)
        batches cover the held-out tokens once. chunks: as draw's."""
        stop = batch_size if stop is None else stop
        return self._windows(self.val_offsets(index, batch_size, start, stop), True, True, device, chunks)

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
    header = read_header(path)
    return TokenDataset(tokens, vocab, seq_len, seed, val_fraction, name=path,
                        tokenizer_sha256=header.tokenizer_sha256 if header else None)

