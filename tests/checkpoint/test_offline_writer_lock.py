"""A writer of one process (hf import) holds a checkpoint directory under the lock a run takes: a run cannot start
there meanwhile, anyone can see the directory is in use, and the lock goes when the writer is done."""
from __future__ import annotations

import os

import pytest

from hybrid_engine import checkpoint
from hybrid_engine.checkpoint import CheckpointError
from hybrid_engine.checkpoint.lock import holding_directory, in_use


def test_an_offline_writer_holds_the_directory_as_a_run_does(tmp_path):
    ckpt = tmp_path / "imported"
    assert not in_use(str(ckpt))
    with holding_directory(str(ckpt), f"CKPT {ckpt}"):
        assert in_use(str(ckpt))
        with pytest.raises(CheckpointError, match=f"^--save {ckpt} is in use by another run \\(pid {os.getpid()} on "):
            checkpoint.hold_directory(str(ckpt), rank=0, world_size=1)
    assert not in_use(str(ckpt))
    run = checkpoint.hold_directory(str(ckpt), rank=0, world_size=1)
    try:
        with pytest.raises(CheckpointError, match=f"^CKPT {ckpt} is in use by another run"):
            with holding_directory(str(ckpt), f"CKPT {ckpt}"):
                pass
    finally:
        run.release()
