"""Checkpoints: a directory per step with one shard per rank, a manifest of full tensor names and shapes, a SHA-256
per shard, and `latest`, published only after the next step's loss passed the divergence guard.

    saving.py        write and publish (two collective steps), prune
    loading.py       read on any grid: checksums, shapes, agreed by every rank
    files.py         the layout, the manifest, reading a checkpoint's files
    digest.py        checksums computed while writing, checked before reading
    agree.py         every rank takes the same decision
    lock.py          one run per --save directory
    engine_state.py  what an Engine exports and loads (full tensors, whatever the grid)
    runs.py          a run's checkpoints seen from the training loop: where it starts, when one is published
    update_settings.py  the update's settings a manifest records (lr schedule, optimizer), said when they change
    offline.py       weights-only checkpoints written and read tensor group by group, without an engine (hf/)

Imports: config, parallel (placement of split tensors). The Engine imports engine_state from here.
"""

from .digest import OutOfTime, newest_complete_before, newest_intact_before
from .files import (FORMAT, LATEST, MANIFEST, NO_OPTIMIZER, Checkpoint, CheckpointError, check_compatible,
                    check_same_data, latest_path, open_checkpoint, pointed_to, read_manifest, shard_name,
                    step_dir_name)
from .loading import load, read_shard
from .offline import read_weights, write_checkpoint
from .lock import agree_on_directory_holds, hold_directory
from .saving import Written, discard, prune, publish, rewind_latest, save, write

__all__ = ["FORMAT", "LATEST", "MANIFEST", "NO_OPTIMIZER", "Checkpoint", "CheckpointError", "OutOfTime", "Written",
           "agree_on_directory_holds", "check_compatible", "check_same_data", "discard", "hold_directory",
           "latest_path", "load", "newest_complete_before", "newest_intact_before", "open_checkpoint", "pointed_to",
           "prune", "publish", "read_manifest", "read_shard", "read_weights", "rewind_latest", "save", "shard_name",
           "step_dir_name", "write", "write_checkpoint"]
