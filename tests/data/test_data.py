"""GPT data (data.py): the Markov corpus and its exact entropy rate, rows that depend on (seed, step, row) alone
(so every DP slicing draws the same numbers), the held-out split, text and token files, the prepare CLI, and
one clear line for each bad input."""
from __future__ import annotations

import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import hybrid_engine.data.datasets as data_mod
from hybrid_engine.data import (
    MAGIC,
    DataError,
    MarkovChain,
    TokenDataset,
    load_tokens,
    main,
    markov_corpus,
    open_dataset,
    prepare,
    tokenizer_path,
    write_token_file,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ = 16
SMALL = 1 << 16  # a small built-in corpus keeps the tests fast


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------ Markov corpus


def test_markov_chain_is_a_proper_stationary_chain_and_depends_on_the_seed_only():
    chain = MarkovChain(7)
    assert np.array_equal(chain.counts.sum(axis=1), np.full(256, chain.quantum))  # exact probabilities
    assert np.allclose(chain.matrix.sum(axis=1), 1.0, atol=0, rtol=1e-15)
    assert (chain.matrix > 0).sum(axis=1).tolist() == [4] * 256  # sparse: 4 successors per byte
    pi = chain.stationary
    assert abs(pi.sum() - 1.0) < 1e-12 and pi.min() > 0
    assert np.abs(pi @ chain.matrix - pi).max() < 1e-12
    assert np.array_equal(MarkovChain(7).matrix, chain.matrix)
    assert not np.array_equal(MarkovChain(8).matrix, chain.matrix)


def test_entropy_rate_is_low_exact_and_what_the_corpus_shows():
    chain = MarkovChain(0)
    h = chain.entropy_rate_nats()
    assert h == pytest.approx(chain.entropy_rate_bits() * math.log(2))
    assert 0.2 < h < 0.5 * math.log(256)  # far below uniform bytes: a model can visibly learn it
    # By hand: sum over states of pi(s) * H(P(. | s)).
    by_hand = sum(chain.stationary[s] * -sum(p * math.log(p) for p in chain.probs[s]) for s in range(256))
    assert h == pytest.approx(by_hand, rel=1e-12)
    # The best possible loss on a long sample approaches the rate (law of large numbers), and the sample's
    # byte frequencies approach the stationary distribution.
    sample = chain.sample(1 << 18, seed=0)
    assert chain.nll_nats(sample) == pytest.approx(h, rel=0.02)
    freq = np.bincount(sample, minlength=256) / sample.size
    assert np.abs(freq - chain.stationary).max() < 5e-3


def test_builtin_corpus_is_the_same_for_the_same_seed_and_carries_its_chain():
    a = open_dataset(None, SEQ, seed=3, markov_tokens=SMALL)
    b = open_dataset(None, SEQ, seed=3, markov_tokens=SMALL)
    assert a.vocab_size == 256 and len(a.tokens) == SMALL and a.tokens.dtype == np.uint8
    assert np.array_equal(a.tokens, b.tokens)
    assert isinstance(a.source, MarkovChain) and a.source.entropy_rate_nats() > 0
    assert not np.array_equal(markov_corpus(4, SMALL)[0], a.tokens)
    with pytest.raises(ValueError):
        a.tokens[0] = 1  # read-only, shared by the cache


# ------------------------------------------------------------------------------------------------ batches


def _dataset(seed: int = 1) -> TokenDataset:
    return open_dataset(None, SEQ, seed=seed, markov_tokens=SMALL)


def test_rows_are_the_same_however_the_batch_is_sliced_over_dp():
    ds = _dataset()
    batch_size = 12
    whole_x, whole_y = ds.batch(5, batch_size)
    assert whole_x.shape == whole_y.shape == (batch_size, SEQ) and whole_x.dtype == torch.int64
    for dp in (1, 2, 3, 4, 6):
        rows = batch_size // dp
        parts = [ds.batch(5, batch_size, r * rows, (r + 1) * rows) for r in range(dp)]
        assert torch.equal(torch.cat([x for x, _ in parts]), whole_x)
        assert torch.equal(torch.cat([y for _, y in parts]), whole_y)
    # Another process (another dataset object) draws the same; the batch size only bounds the rows.
    again = _dataset()
    assert torch.equal(again.batch(5, batch_size)[0], whole_x)
    assert torch.equal(again.batch(5, 2 * batch_size)[0][:batch_size], whole_x)
    # Inputs alone (first stage) and targets alone (last stage) are the same numbers.
    x_only, none = ds.draw(5, 3, 7, targets=False)
    none2, y_only = ds.draw(5, 3, 7, inputs=False)
    assert none is None and none2 is None
    assert torch.equal(x_only, whole_x[3:7]) and torch.equal(y_only, whole_y[3:7])
    # Steps and seeds differ.
    assert not torch.equal(ds.batch(6, batch_size)[0], whole_x)
    assert not torch.equal(_dataset(seed=2).batch(5, batch_size)[0], open_dataset(
        None, SEQ, seed=2, markov_tokens=SMALL).batch(6, batch_size)[0])


def test_targets_are_the_next_tokens_of_the_inputs():
    ds = _dataset()
    x, y = ds.batch(0, 4)
    assert torch.equal(x[:, 1:], y[:, :-1])
    offsets = ds.train_offsets(0, 0, 4)
    for row, off in enumerate(offsets):
        assert torch.equal(y[row], torch.from_numpy(ds.tokens[off + 1: off + SEQ + 1].astype(np.int64)))


def test_held_out_tail_is_never_trained_on_and_validation_covers_it_once():
    ds = _dataset()
    assert ds.val_tokens == math.ceil(SMALL * 0.01) and ds.train_tokens + ds.val_tokens == SMALL
    starts = np.concatenate([ds.train_offsets(step, 0, 256) for step in range(64)])
    assert starts.min() >= 0 and starts.max() + SEQ + 1 <= ds.train_tokens  # whole windows, no held-out token
    assert len(np.unique(starts)) > 0.5 * min(starts.size, ds.train_windows)  # spread over the file
    batch_size = 7
    targets = [ds.val_batch(i, batch_size)[1] for i in range(ds.val_batches(batch_size))]
    covered = torch.cat(targets)[: ds.val_windows].reshape(-1)
    tail = torch.from_numpy(ds.tokens[ds.train_tokens + 1: ds.train_tokens + 1 + ds.val_windows * SEQ].astype(
        np.int64))
    assert torch.equal(covered, tail)  # every held-out target once, in order
    x, y = ds.val_batch(3, batch_size, 2, 5)
    assert torch.equal(x, ds.val_batch(3, batch_size)[0][2:5])
    assert TokenDataset(ds.tokens, 256, SEQ, 0, val_fraction=0.0).val_tokens == 0


# ------------------------------------------------------------------------------------------------ files


def test_text_file_is_byte_tokens(tmp_path):
    text = "hello, world\n" * 20
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode())
    ds = open_dataset(str(path), 8, seed=0)
    assert ds.vocab_size == 256 and bytes(np.asarray(ds.tokens)) == text.encode()
    x, y = ds.batch(0, 3)
    assert x.max() < 256


def test_prepare_round_trip_and_cli(tmp_path, capsys):
    src = tmp_path / "in.txt"
    payload = bytes(range(256)) * 3 + "ünïcode\n".encode()
    src.write_bytes(payload)
    out = tmp_path / "out.tok"
    assert main(["prepare", str(src), str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: {len(payload)} tokens, vocabulary 256"
    assert main(["info", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: token file, {len(payload)} tokens, vocabulary 256"
    with open(out, "rb") as f:
        magic, version, width, vocab, count = struct.unpack("<8sIIQQ", f.read(32))
    assert (magic, version, width, vocab, count) == (MAGIC, 1, 2, 256, len(payload))
    tokens, vocab = load_tokens(str(out))
    assert vocab == 256 and tokens.dtype == np.uint16 and bytes(tokens.astype(np.uint8)) == payload
    ds = open_dataset(str(out), 16, seed=0)
    assert ds.vocab_size == 256 and len(ds.tokens) == len(payload)
    # A vocabulary over 65536 is stored as uint32.
    big = tmp_path / "big.tok"
    write_token_file(str(big), np.array([0, 70000, 5] * 10), 70001)
    tokens, vocab = load_tokens(str(big))
    assert tokens.dtype == np.uint32 and vocab == 70001 and tokens[1] == 70000
    # The real command line, once (a process costs seconds): a missing input exits 2 with one line.
    env = {**os.environ, "PYTHONPATH": REPO}
    bad = subprocess.run([sys.executable, "-m", "hybrid_engine.data", "prepare", str(tmp_path / "nope"), str(out)],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "does not exist" in bad.stderr


def test_bpe_without_tokenizers_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_tokenizers(name, *args, **kwargs):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    src = tmp_path / "in.txt"
    src.write_text("some text\n" * 10)
    assert main(["prepare", str(src), str(tmp_path / "o.tok"), "--bpe", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install tokenizers" in err


def test_bpe_round_trip_with_the_tokenizer_kept_beside_the_tokens(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    text = "the quick brown fox jumps over the lazy dog. ünïcode ✓\n" * 50
    src, out = tmp_path / "in.txt", tmp_path / "o.tok"
    src.write_text(text, encoding="utf-8")
    count, vocab = prepare(str(src), str(out), bpe=300)
    assert vocab == 300 and os.path.exists(tokenizer_path(str(out)))
    tokens, v = load_tokens(str(out))
    assert v == 300 and len(tokens) == count < len(text.encode())
    tok = tokenizers.Tokenizer.from_file(tokenizer_path(str(out)))
    assert tok.decode(tokens.tolist()) == text


@pytest.mark.parametrize("case,message", [
    ("missing", "does not exist"),
    ("empty", "is empty"),
    ("short", "shorter than seq_len + 1 = 17"),
    ("no_room_to_hold_out", "too few to train on seq_len + 1 = 17 and hold out 17"),
    ("id_too_large", "holds token id 12, at or above its vocabulary size 10"),
    ("truncated", "is truncated"),
    ("empty_token_file", "is empty (its header counts 0 tokens)"),
])
def test_bad_inputs_give_one_clear_line(tmp_path, case, message):
    path = tmp_path / "data.bin"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "short":
        path.write_bytes(b"x" * 16)
    elif case == "no_room_to_hold_out":
        path.write_bytes(b"x" * 20)
    elif case == "id_too_large":
        with open(path, "wb") as f:
            f.write(struct.pack("<8sIIQQ", MAGIC, 1, 2, 10, 40))
            np.array([1, 12] * 20, dtype=np.uint16).tofile(f)
    elif case == "truncated":
        with open(path, "wb") as f:
            f.write(struct.pack("<8sIIQQ", MAGIC, 1, 2, 10, 400))
            np.zeros(40, dtype=np.uint16).tofile(f)
    elif case == "empty_token_file":
        path.write_bytes(struct.pack("<8sIIQQ", MAGIC, 1, 2, 10, 0))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")) as err:
        open_dataset(str(path), SEQ, seed=0)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_uint64_hash_is_stable():
    # Pinned values: a change of the row hash would silently change every run's data.
    assert data_mod._row_hash(0, 0, np.arange(3)).tolist() == [
        17021346266588984987, 16380316983494842420, 15021380805948875593]
    assert data_mod._row_hash(5, 7, np.arange(2)).tolist() == [17418666530816411377, 17837977857460327751]
    assert len(set(data_mod._row_hash(0, 0, np.arange(1000)).tolist())) == 1000
