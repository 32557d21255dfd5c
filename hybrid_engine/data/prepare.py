"""`python -m hybrid_engine.data prepare IN OUT [--bpe N | --tokenizer HF_DIR] [--force]` (and `info PATH`): text ->
a token file.

    python -m hybrid_engine.data prepare book.txt runs/book.tok              # bytes, vocabulary 256
    python -m hybrid_engine.data prepare book.txt runs/book.tok --bpe 4096   # byte-level BPE; OUT.tokenizer.json
    python -m hybrid_engine.data prepare book.txt runs/book.tok --tokenizer llama-dir   # a model's own tokenizer

Nothing a user has is overwritten by mistake: OUT (and, with --bpe, its tokenizer) must not be IN or --tokenizer,
nor lie inside a --tokenizer folder, also through a link (config/paths_apart.py), and an existing OUT is replaced
only with --force. OUT's folder is created, as --save's is. Every failure is one line and exit 2, and no temporary
file is left behind.
"""
from __future__ import annotations

import argparse
import codecs
import hashlib
import itertools
import os
import sys
from typing import Optional, Sequence

import numpy as np

from hybrid_engine.config.paths_apart import Output, clash

from .token_files import (DataError, check_data_file, load_tokens, read_header, tokenizer_path,
                          write_token_file)

MAX_BPE_VOCAB = 1 << 20  # token ids are stored as uint32; tokenizers' trainer aborts the process far beyond this
_CHUNK = 1 << 20


def _check_output(in_path: str, out: str, force: bool, what: str, tokenizer: str | None = None) -> None:
    """`out` may be written: not an input (also through a link), not a directory, replaced only with --force;
    its folder is created."""
    problem = clash([Output(f"{what} {out}", out)], [(f"the input {in_path}", in_path),
                                                     (f"--tokenizer {tokenizer}", tokenizer)])
    if problem:
        raise DataError(problem)
    if os.path.isdir(out):
        raise DataError(f"{what} {out} is a directory: give a file name")
    if os.path.lexists(out) and not force:
        raise DataError(f"{what} {out} exists: pass --force to replace it")
    folder = os.path.dirname(out)
    try:
        os.makedirs(folder or ".", exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the folder {folder} for {out} ({exc.strerror})") from None


def _check_utf8(path: str) -> None:
    """BPE is trained on text: refuse a file that is not UTF-8, naming the first bad byte's offset."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                raise DataError(f"--bpe trains on UTF-8 text; {path} is not (byte 0x{chunk[exc.start]:02x} at offset "
                                f"{offset + exc.start}): without --bpe it is tokenized as bytes") from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"--bpe trains on UTF-8 text; {path} ends inside a character: without --bpe it is "
                        "tokenized as bytes") from None


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
    try:
        tokenizer.train([text_path], trainer)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exceptions
        raise DataError(f"--bpe {vocab_size}: training on {text_path} failed ({str(exc).splitlines()[0]})") from None
    tmp = f"{out_json}.tmp{os.getpid()}"
    try:
        tokenizer.save(tmp)
        os.replace(tmp, out_json)
    except Exception as exc:  # noqa: BLE001 - an OSError, or tokenizers' Exception around one
        raise DataError(f"cannot write {out_json}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return tokenizer


def _load_tokenizer(path: str):
    """A tokenizers file, or a Hugging Face model directory's tokenizer.json: (the tokenizer, the file's SHA-256)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    try:
        with open(file, "rb") as f:
            raw = f.read()
        return Tokenizer.from_str(raw.decode("utf-8")), hashlib.sha256(raw).hexdigest()
    except OSError as exc:
        raise DataError(f"--tokenizer {file} cannot be read ({exc.strerror})") from None
    except Exception as exc:  # noqa: BLE001 - tokenizers raises bare Exceptions
        raise DataError(f"--tokenizer {file} cannot be read ({str(exc).splitlines()[0]})") from None


def _encode(in_path: str, tokenizer) -> np.ndarray:
    """The text's ids, without the special tokens a tokenizer adds per encoded piece (a BOS per line batch would
    sprinkle the corpus); streamed: the text is never all in memory."""
    chunks: list[np.ndarray] = []
    with open(in_path, "r", encoding="utf-8", newline="") as f:
        while lines := list(itertools.islice(f, 4096)):
            ids = [i for enc in tokenizer.encode_batch(lines, add_special_tokens=False) for i in enc.ids]
            chunks.append(np.asarray(ids, dtype=np.uint32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint32)


def prepare(in_path: str, out_path: str, bpe: Optional[int] = None, force: bool = False,
            tokenizer: Optional[str] = None) -> tuple[int, int]:
    """Tokenize `in_path` into a token file at `out_path`: bytes (vocabulary 256), an N-token BPE trained on the
    input (saved beside it, see tokenizer_path, its SHA-256 in the token file's header), or an existing tokenizer
    (a tokenizer.json, or a Hugging Face model directory holding one; its SHA-256 in the header). An existing
    output is replaced only with `force`. Returns (token count, vocabulary size)."""
    check_data_file(in_path)
    if bpe is not None and tokenizer is not None:
        raise DataError("--bpe trains a tokenizer and --tokenizer names one: give one of them")
    if tokenizer is not None:
        _check_output(in_path, out_path, force, "output", tokenizer)
        _check_utf8(in_path)
        tok, digest = _load_tokenizer(tokenizer)
        tokens, vocab = _encode(in_path, tok), tok.get_vocab_size()
        write_token_file(out_path, tokens, vocab, tokenizer_sha256=digest)
        return tokens.size, vocab
    if bpe is not None and not 257 <= bpe <= MAX_BPE_VOCAB:
        raise DataError(f"--bpe {bpe}: a byte-level BPE needs a vocabulary of at least 257 (256 bytes + merges)"
                        if bpe < 257 else f"--bpe {bpe} is too large (at most {MAX_BPE_VOCAB} tokens)")
    _check_output(in_path, out_path, force, "output")
    if bpe is None:
        tokens = np.fromfile(in_path, dtype=np.uint8)
        write_token_file(out_path, tokens, 256)
        return tokens.size, 256
    _check_output(in_path, tokenizer_path(out_path), force, "the tokenizer")
    _check_utf8(in_path)
    tokenizer = _train_bpe(in_path, bpe, tokenizer_path(out_path))
    tokens, vocab = _encode(in_path, tokenizer), tokenizer.get_vocab_size()
    with open(tokenizer_path(out_path), "rb") as f:  # the tokenizer file's bytes, as sample reads them
        digest = hashlib.sha256(f.read()).hexdigest()
    write_token_file(out_path, tokens, vocab, tokenizer_sha256=digest)
    return tokens.size, vocab


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybrid_engine.data",
                                     description="Prepare token files for the GPT (see hybrid_engine/data/datasets.py).")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize a text file into a memory-mapped token file")
    prep.add_argument("input")
    prep.add_argument("output", help="the token file to write (its folder is created)")
    prep.add_argument("--bpe", type=int, default=None, metavar="N",
                      help="train an N-token byte-level BPE (needs: pip install tokenizers); default: bytes")
    prep.add_argument("--tokenizer", default=None, metavar="HF_DIR",
                      help="tokenize with this tokenizer.json, or a Hugging Face model directory's (needs tokenizers)")
    prep.add_argument("--force", action="store_true", help="replace an existing output (and its tokenizer)")
    info = sub.add_parser("info", help="describe a data file")
    info.add_argument("path")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            count, vocab = prepare(args.input, args.output, args.bpe, force=args.force, tokenizer=args.tokenizer)
            extra = f", tokenizer {tokenizer_path(args.output)}" if args.bpe else ""
            print(f"wrote {args.output}: {count} tokens, vocabulary {vocab}{extra}")
        else:
            tokens, vocab = load_tokens(args.path)
            kind = "token file" if read_header(args.path) is not None else "bytes"
            print(f"{args.path}: {kind}, {len(tokens)} tokens, vocabulary {vocab}")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
