"""Byte-level BPE from a real text to samples: `python -m hybrid_engine.data prepare IN OUT --bpe N` writes a token
file whose header names the BPE vocabulary and keeps the tokenizer beside it, the tokens decode back to the text,
the driver trains on the token file, and `python -m hybrid_engine.sample --tokenizer` decodes with it.

The real text is this repository's own documentation (README.md and docs/architecture.md: English prose, code and
tables). BPE needs the optional `tokenizers` package: without it these tests skip (a user's checkout), but
scripts/setup.sh installs it, so CI runs them.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
import struct

import numpy as np
import pytest
import torch

import hybrid_engine.data as data
from hybrid_engine.train import sample
from hybrid_engine.models.gpt.model import generate

tokenizers = pytest.importorskip("tokenizers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 512


def real_text(directory) -> tuple[str, str]:
    """(path, text) of the repository's documentation, concatenated into one UTF-8 file."""
    text = ""
    for name in ("README.md", "docs/architecture.md"):
        with open(os.path.join(REPO, name), encoding="utf-8", newline="") as f:
            text += f.read()
    path = os.path.join(str(directory), "docs.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path, text


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The documentation prepared with --bpe 512 through the CLI's main, and what it printed."""
    directory = tmp_path_factory.mktemp("bpe")
    src, text = real_text(directory)
    out = os.path.join(str(directory), "docs.tok")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert data.main(["prepare", src, out, "--bpe", str(VOCAB)]) == 0
    return {"dir": directory, "src": src, "text": text, "out": out, "printed": printed.getvalue()}


def test_prepare_bpe_writes_the_vocabulary_in_the_header_and_the_tokenizer_beside_it(prepared):
    out = prepared["out"]
    with open(out, "rb") as f:  # version 2: the header also holds the SHA-256 of the tokenizer file
        magic, version, width, vocab, count, tokenizer_sha256 = struct.unpack("<8sIIQQ32s", f.read(64))
    assert (magic, version, width, vocab) == (data.MAGIC, 2, 2, VOCAB)  # 512 ids fit uint16
    assert os.path.getsize(out) == 64 + 2 * count
    with open(data.tokenizer_path(out), "rb") as f:
        assert tokenizer_sha256 == hashlib.sha256(f.read()).digest()
    assert prepared["printed"].strip() == (f"wrote {out}: {count} tokens, vocabulary {VOCAB}, "
                                           f"tokenizer {data.tokenizer_path(out)}")
    tok = tokenizers.Tokenizer.from_file(data.tokenizer_path(out))
    assert tok.get_vocab_size() == VOCAB
    tokens, v = data.load_tokens(out)
    assert v == VOCAB and len(tokens) == count and int(tokens.max()) < VOCAB
    # Merges learned on English compress it: measured 1.95 bytes per token at 512 on these documents.
    assert len(prepared["text"].encode()) / count > 1.6


def test_bpe_tokens_decode_back_to_the_text(prepared):
    tokens, _ = data.load_tokens(prepared["out"])
    tok = tokenizers.Tokenizer.from_file(data.tokenizer_path(prepared["out"]))
    assert tok.decode(np.asarray(tokens).tolist()) == prepared["text"]
    # And the dataset's windows are those tokens: a training row decodes to a piece of the text.
    ds = data.open_dataset(prepared["out"], 32, seed=0)
    x, y = ds.batch(0, 4)
    assert ds.vocab_size == VOCAB and torch.equal(x[:, 1:], y[:, :-1])
    # A window may start or end inside a multi-byte character (the text holds e.g. "×"): byte-level BPE decodes
    # such an edge as U+FFFD, so only the edges may differ.
    assert all(tok.decode(row.tolist()).strip("\ufffd") in prepared["text"] for row in x)


def _losses(stdout: str, what: str) -> list[float]:
    """The numbers after `what` at the start of the driver's lines ("step 3  loss", "step 3: validation loss")."""
    return [float(v) for v in re.findall(rf"^step +\d+:? +{what} ([0-9.]+)", stdout, re.MULTILINE)]


def test_driver_trains_on_the_bpe_token_file_and_sample_decodes_with_its_tokenizer(prepared, capsys):
    from launch_utils import torchrun

    out, ckpt = prepared["out"], os.path.join(str(prepared["dir"]), "ckpt")
    run = torchrun(2, "--model", "gpt", "--pp", "2", "--tie-embeddings", "--data", out, "--layers", "2",
                   "--hidden", "32", "--heads", "2", "--seq-len", "32", "--batch-size", "8", "--micro-batches", "2",
                   "--optimizer", "adamw", "--lr", "0.01", "--steps", "6", "--eval-every", "3", "--save", ckpt,
                   timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"vocab {VOCAB}" in run.stdout  # the model's vocabulary is the token file's
    train, val = _losses(run.stdout, "loss"), _losses(run.stdout, "validation loss")
    assert len(train) == 6 and len(val) == 2 and all(math.isfinite(v) for v in train + val)
    assert train[0] == pytest.approx(math.log(VOCAB), rel=0.05)  # starts near uniform over 512 tokens
    assert val[-1] < val[0] and train[-1] < train[0]

    tokenizer = data.tokenizer_path(out)
    assert sample.main(["--load", ckpt, "--prompt", "The engine", "--tokens", "12", "--temperature", "0",
                        "--tokenizer", tokenizer]) == 0
    # print adds one newline; strip only that one, since a greedy continuation may itself end in newlines.
    out_text = capsys.readouterr().out
    assert out_text.endswith("\n")
    text = out_text[:-1]
    # The same greedy continuation, by hand: the dense model, the tokenizer's ids in and its text out.
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    model, cfg = sample.load_gpt(ckpt)
    assert cfg.vocab_size == VOCAB
    prompt = tok.encode("The engine").ids
    ids = generate(model, torch.tensor([prompt]), 12, 0.0, 0)[0].tolist()
    assert len(ids) == len(prompt) + 12 and text == tok.decode(ids) and text.startswith("The engine")

    # Without the tokenizer, or with one of another vocabulary, or an unreadable file: one line, exit 2.
    assert sample.main(["--load", ckpt, "--prompt", "x"]) == 2
    assert "pass --tokenizer FILE" in capsys.readouterr().err
    other = os.path.join(str(prepared["dir"]), "other.tok")
    data.prepare(prepared["src"], other, bpe=300)
    assert sample.main(["--load", ckpt, "--prompt", "x", "--tokenizer", data.tokenizer_path(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has a vocabulary of 300, the checkpoint's model 512" in err
    assert sample.main(["--load", ckpt, "--prompt", "x", "--tokenizer", other + ".missing.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be read" in err
