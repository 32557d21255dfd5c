"""`python -m hybrid_engine.data prepare` and token files on inputs a hostile or unlucky user hands them, in this
process: nothing the user has is overwritten, every failure is one line and exit 2 with no temporary file left
behind, and a token file whose magic is damaged is refused, never trained on as text."""
from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest

import hybrid_engine.data as data
from hybrid_engine.data import DataError


def _fails(capsys, *argv: str) -> str:
    assert data.main(["prepare", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("It was the best of times, it was the worst of times.\n" * 40)
    return path


# ------------------------------------------------------------------------------------------ 4. never the input
def test_the_output_may_not_be_the_input_also_through_a_link(tmp_path, book, capsys):
    text = book.read_bytes()
    assert _fails(capsys, str(book), str(book)) == (f"error: output {book} is the input {book}: writing it would "
                                                    "destroy what is read (give another name)")
    os.symlink(book, tmp_path / "link.tok")
    os.link(book, tmp_path / "hard.tok")
    for other in ("link.tok", "hard.tok"):
        assert "is the input" in _fails(capsys, str(book), str(tmp_path / other), "--force")
    assert book.read_bytes() == text


def test_an_existing_output_is_replaced_only_with_force(tmp_path, book, capsys):
    out = tmp_path / "book.tok"
    out.write_bytes(b"my other data")
    assert _fails(capsys, str(book), str(out)) == f"error: output {out} exists: pass --force to replace it"
    assert out.read_bytes() == b"my other data"
    assert data.main(["prepare", str(book), str(out), "--force"]) == 0
    assert data.load_tokens(str(out))[1] == 256


# ---------------------------------------------------------------------------------- 10. folders, writes, --bpe
def test_the_output_folder_is_created_as_save_does(tmp_path, book, capsys):
    out = tmp_path / "runs" / "shake" / "book.tok"  # a fresh clone has no runs/
    assert data.main(["prepare", str(book), str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}:")


def test_an_output_that_is_a_folder_or_under_a_file_is_one_line(tmp_path, book, capsys):
    assert _fails(capsys, str(book), str(tmp_path)) == f"error: output {tmp_path} is a directory: give a file name"
    assert _fails(capsys, str(book), str(book / "x.tok")).startswith(f"error: cannot create the folder {book} for ")
    assert sorted(os.listdir(tmp_path)) == ["book.txt"]


class _FullDisk(io.FileIO):
    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_that_fails_is_one_line_and_leaves_no_temporary(tmp_path, book, capsys, monkeypatch):
    from hybrid_engine.data import token_files

    monkeypatch.setattr(token_files, "open", lambda path, mode="r": _FullDisk(path, "w"), raising=False)
    out = tmp_path / "book.tok"
    assert _fails(capsys, str(book), str(out)) == f"error: cannot write {out}: No space left on device"
    assert sorted(os.listdir(tmp_path)) == ["book.txt"]


def test_bpe_on_a_binary_file_is_one_line(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"text first, then " + bytes(range(256)) * 4)
    assert _fails(capsys, str(blob), str(tmp_path / "o.tok"), "--bpe", "300") == (
        f"error: --bpe trains on UTF-8 text; {blob} is not (byte 0x80 at offset 145): without --bpe it is "
        "tokenized as bytes")
    assert sorted(os.listdir(tmp_path)) == ["blob.bin"]


def test_a_bpe_vocabulary_beyond_a_million_is_one_line_not_an_abort(tmp_path, book, capsys):
    assert _fails(capsys, str(book), str(tmp_path / "o.tok"), "--bpe", "99999999999") == (
        "error: --bpe 99999999999 is too large (at most 1048576 tokens)")


# --------------------------------------------------------------------------- 5. a token file's damaged magic
@pytest.mark.parametrize("damage", [b"XXtokens", b"\0" * 8, b"HEtokenz"])
def test_a_token_file_with_a_damaged_magic_is_refused_not_read_as_text(tmp_path, damage):
    path = tmp_path / "d.tok"
    data.write_token_file(str(path), np.arange(300) % 250, 256)
    with open(path, "r+b") as f:
        f.write(damage)
    with pytest.raises(DataError) as err:
        data.open_dataset(str(path), 16, seed=0)
    assert str(err.value) == (f"token file {path} has a damaged header (its first 8 bytes are not b'HEtokens', yet "
                              "the rest is a token file's header): restore it, or prepare it again")
