"""Token files: the header, reading (a read-only memmap) and writing, and a fingerprint of any token array.

Format (little-endian): a header, then the tokens (uint16 when the vocabulary fits, else uint32).

    version 1, 32 bytes: magic b"HEtokens", u32 version, u32 bytes per token (2 or 4), u64 vocabulary, u64 count
    version 2, 64 bytes: the same, then the SHA-256 (32 bytes) of the tokenizer file the tokens were made with

`prepare --bpe` writes version 2, so that `sample` can tell the tokenizer that decodes a model's ids from another
one of the same vocabulary size (other merges decode garbage); a byte-level file (vocabulary 256, no tokenizer)
stays version 1, which every reader knows. Any file without the magic is text: its bytes are the tokens. A file
whose magic is damaged but whose other header fields describe it exactly (version, width, vocabulary, and a
size of header + count x width) is refused, never read as text.
"""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"HEtokens"
_HEADERS = {1: struct.Struct("<8sIIQQ"), 2: struct.Struct("<8sIIQQ32s")}  # magic, version, width, vocab, count[, sha]
_DTYPES = {2: np.uint16, 4: np.uint32}
_NO_TOKENIZER = bytes(32)


class DataError(ValueError):
    """Bad data input; the message is the one line the user sees."""


@dataclass(frozen=True)
class TokenFileHeader:
    version: int
    width: int
    vocab: int
    count: int
    tokenizer_sha256: str | None  # None: no tokenizer recorded (bytes, or a version-1 file)

    @property
    def size(self) -> int:
        return _HEADERS[self.version].size


def tokenizer_path(token_file: str) -> str:
    """Where `prepare --bpe` keeps the tokenizer of a token file."""
    return f"{token_file}.tokenizer.json"


def check_data_file(path: str) -> int:
    """The size of data file `path`, which must be a non-empty regular file (a FIFO is never opened)."""
    if not os.path.exists(path):
        raise DataError(f"data file {path} does not exist")
    if not os.path.isfile(path):
        raise DataError(f"data file {path} is not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"data file {path} is empty")
    return size


def _fields(head: bytes) -> tuple | None:
    """(version, width, vocab, count, sha) from the bytes of a header, whatever its magic; None if too short."""
    if len(head) < _HEADERS[1].size:
        return None
    version = struct.unpack_from("<I", head, 8)[0]
    layout = _HEADERS.get(version, _HEADERS[1])
    if len(head) < layout.size:
        return None
    _, *rest = layout.unpack_from(head)
    return (*rest, None) if len(rest) == 4 else tuple(rest)


def _describes(fields: tuple | None, size: int) -> bool:
    """Whether header fields describe a file of `size` bytes exactly (what text never does by chance)."""
    if fields is None:
        return False
    version, width, vocab, count, _ = fields
    return (version in _HEADERS and width in _DTYPES and 1 <= vocab <= 1 << (8 * width) and count > 0
            and size == _HEADERS[version].size + count * width)


def read_header(path: str) -> TokenFileHeader | None:
    """The header of token file `path`, or None for a file without one (text, read as bytes)."""
    size = check_data_file(path)
    with open(path, "rb") as f:
        head = f.read(max(h.size for h in _HEADERS.values()))
    fields = _fields(head)
    if not head.startswith(MAGIC):
        near = sum(a != b for a, b in zip(head[:8], MAGIC)) <= 2 and fields is not None and fields[0] in _HEADERS
        if _describes(fields, size) or near:
            raise DataError(f"token file {path} has a damaged header (its first 8 bytes are not {MAGIC!r}, yet the "
                            "rest is a token file's header): restore it, or prepare it again")
        return None
    if fields is None:
        raise DataError(f"token file {path} has a truncated header ({min(len(head), size)} of "
                        f"{_HEADERS[1].size} bytes)")
    version, width, vocab, count, sha = fields
    if version not in _HEADERS or width not in _DTYPES:
        raise DataError(f"token file {path} has version {version} and {width} bytes per token; this reader "
                        f"knows versions {', '.join(map(str, _HEADERS))} with 2 or 4")
    if vocab < 1 or vocab > (1 << (8 * width)):
        raise DataError(f"token file {path} names vocabulary {vocab}, impossible with {width}-byte tokens")
    if count == 0:
        raise DataError(f"token file {path} is empty (its header counts 0 tokens)")
    header = TokenFileHeader(version, width, vocab, count,
                             None if sha in (None, _NO_TOKENIZER) else sha.hex())
    if size < header.size + count * width:
        raise DataError(f"token file {path} is truncated: its header counts {count} tokens, the file holds "
                        f"{(size - header.size) // width}")
    return header


def load_tokens(path: str, check_ids: bool = True) -> tuple[np.ndarray, int]:
    """(tokens as a read-only memmap, vocabulary size) of a token file, or of any other file as bytes (256)."""
    header = read_header(path)
    if header is None:
        return np.memmap(path, dtype=np.uint8, mode="r"), 256
    tokens = np.memmap(path, dtype=_DTYPES[header.width], mode="r", offset=header.size, shape=(header.count,))
    if check_ids:
        top = max(int(tokens[i : i + (1 << 24)].max()) for i in range(0, header.count, 1 << 24))
        if top >= header.vocab:
            raise DataError(f"token file {path} holds token id {top}, at or above its vocabulary size {header.vocab}")
    return tokens, int(header.vocab)


def write_token_file(path: str, tokens: np.ndarray, vocab_size: int, tokenizer_sha256: str | None = None) -> None:
    """Write tokens (< vocab_size) with the header (version 2 when a tokenizer's SHA-256 is given); uint16 when
    the vocabulary fits, else uint32. Atomic: a temporary file beside it, removed again if anything fails."""
    tokens = np.asarray(tokens)
    if tokens.size == 0:
        raise DataError(f"refusing to write {path}: no tokens")
    top = int(tokens.max())
    if top >= vocab_size or int(tokens.min()) < 0:
        raise DataError(f"refusing to write {path}: token id {top} is outside vocabulary {vocab_size}")
    width = 2 if vocab_size <= (1 << 16) else 4
    if tokenizer_sha256 is None:
        header = _HEADERS[1].pack(MAGIC, 1, width, vocab_size, tokens.size)
    else:
        header = _HEADERS[2].pack(MAGIC, 2, width, vocab_size, tokens.size, bytes.fromhex(tokenizer_sha256))
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            tokens.astype(_DTYPES[width]).tofile(f)
        os.replace(tmp, path)
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def fingerprint(tokens: np.ndarray, vocab: int, blocks: int = 64, block: int = 4096) -> str:
    """A short SHA-256 of the token count, the vocabulary and `blocks` evenly spaced blocks of tokens: what tells
    one data set from another without reading all of it (a checkpoint records it; a resumed run compares)."""
    digest = hashlib.sha256(f"{len(tokens)}:{vocab}:".encode())
    step = max(block, len(tokens) // blocks)
    for start in range(0, len(tokens), step):
        digest.update(np.ascontiguousarray(tokens[start:start + block]).tobytes())
    return digest.hexdigest()[:16]
