"""`python -m hybrid_engine.sample` on inputs a hostile or unlucky user hands it (issue #26): one line on stderr,
exit 2, before anything large is built or anything blocks; in this process, on checkpoints written here."""
from __future__ import annotations

import os

import pytest

from checkpoint_fakes import SMALL_GPT, write_gpt_checkpoint
from hybrid_engine import sample


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
