"""`python -m hybrid_engine.sample` on inputs a hostile or unlucky user hands it: one line on stderr, exit 2,
before anything large is built or anything blocks; in this process, on checkpoints written here."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from checkpoint_fakes import SMALL_GPT, sha256_of, write_gpt_checkpoint
from hybrid_engine.train import sample

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fails(capsys, *argv: str) -> str:
    """sample's one error line (and exit 2) for these arguments."""
    assert sample.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def test_a_gpt_shard_damaged_in_place_is_refused(tmp_path, capsys):
    from test_checkpoint import flip_tensor_bytes

    path = write_gpt_checkpoint(tmp_path / "ckpt")
    assert sample.main(["--load", path, "--prompt", "ab", "--tokens", "2"]) == 0
    capsys.readouterr()
    shard = os.path.join(path, "rank_00000.pt")
    flip_tensor_bytes(shard, "1.attn_qkv.weight", count=64)
    assert _fails(capsys, "--load", path, "--prompt", "ab", "--tokens", "2") == (
        f"error: checkpoint shard {shard} cannot be read (its SHA-256 is not the one its manifest records): "
        "damaged since it was written")


def _edit_model(path: str, **changes) -> None:
    manifest_path = os.path.join(path, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["model"].update(changes)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


# ------------------------------------------------------------------------------- 5. the token file's tokenizer
def _text(seed: int) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(300)]
    return " ".join(rng.choice(words) for _ in range(6000)) + "\n"


def test_a_tokenizer_of_the_same_size_but_other_merges_is_refused(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    import hybrid_engine.data as data

    made = {}
    for name, seed in (("ours", 0), ("other", 1)):
        (tmp_path / f"{name}.txt").write_text(_text(seed))
        count, vocab = data.prepare(str(tmp_path / f"{name}.txt"), str(tmp_path / f"{name}.tok"), bpe=300)
        made[name] = data.tokenizer_path(str(tmp_path / f"{name}.tok"))
        assert vocab == 300
    recorded = data.read_header(str(tmp_path / "ours.tok")).tokenizer_sha256
    assert recorded == sha256_of(made["ours"])  # prepare wrote it into the token file's header
    cfg = dataclasses.replace(SMALL_GPT, vocab_size=300)
    path = write_gpt_checkpoint(tmp_path / "ckpt", cfg, run_info={"data": {"tokenizer_sha256": recorded}})
    assert _fails(capsys, "--load", path, "--prompt", "abc", "--tokens", "2", "--tokenizer", made["other"]) == (
        f"error: --tokenizer {made['other']} is not the tokenizer of the token file this checkpoint was trained on "
        "(its SHA-256 differs from the one the token file recorded): it would decode the model's ids into other text")
    assert sample.main(["--load", path, "--prompt", "abc", "--tokens", "2", "--tokenizer", made["ours"]]) == 0


# ------------------------------------------------------------------------------------- 7. a FIFO never blocks
def test_a_tokenizer_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    # a process, not a thread: tokenizers' from_file blocks in open() holding the GIL, which would hang pytest
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    run = subprocess.run([sys.executable, "-m", "hybrid_engine.sample", "--load", path, "--prompt", "ab",
                          "--tokenizer", str(fifo)], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert run.returncode == 2 and run.stderr == f"error: --tokenizer {fifo} is a FIFO, not a regular file\n"


# ------------------------------------------------------------------- 8. nothing is built that cannot fit
def test_a_manifest_describing_a_huge_gpt_is_refused_before_anything_is_built(tmp_path, capsys):
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    _edit_model(path, layers=10**7, hidden=2**20)
    assert _fails(capsys, "--load", path, "--prompt", "ab") == (
        f"error: checkpoint {path} describes a GPT of layers 10000000, more than 65536: damaged, or not written by "
        "hybrid_engine")
    _edit_model(path, layers=64, hidden=2**16)  # within every limit, but 12 TiB of weights
    err = _fails(capsys, "--load", path, "--prompt", "ab")
    assert err.startswith(f"error: the GPT of checkpoint {path} (64 layers, hidden 65536, vocabulary 256) needs at "
                          "least 12.0 TiB of fp32 weights, more than this machine's memory ("), err
    assert err.endswith("): damaged, or too large to sample from here"), err


# -------------------------------------------------------------------------------------- 11. one line, not a trace
def test_a_temperature_that_is_not_a_number_is_one_line(tmp_path, capsys):
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    assert _fails(capsys, "--load", path, "--prompt", "ab", "--temperature", "nan") == (
        "error: --tokens must be >= 0 and --temperature a finite number >= 0, got 200 and nan")


def test_a_number_of_tokens_beyond_the_bound_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    assert _fails(capsys, "--load", str(tmp_path / "nowhere"), "--prompt", "ab", "--tokens", "1000000000") == (
        "error: --tokens 1000000000 is too large (at most 1048576 a call)")


@pytest.mark.parametrize("key, value, param, there, here", [
    ("vocab_size", 300, "0.word", [256, 32], [300, 32]),
    ("seq_len", 64, "0.position", [16, 32], [64, 32]),
])
def test_a_model_entry_that_does_not_fit_the_weights_is_one_line(tmp_path, capsys, key, value, param, there, here):
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    _edit_model(path, **{key: value})
    shape = dataclasses.replace(SMALL_GPT, **{key: value})
    assert _fails(capsys, "--load", path, "--prompt", "ab") == (
        f"error: checkpoint {path} does not fit its GPT config: parameter {param} is {there} there, {here} for the "
        f"model entry's vocab_size {shape.vocab_size}, hidden 32, seq_len {shape.seq_len}: damaged, or not written by "
        "hybrid_engine")
