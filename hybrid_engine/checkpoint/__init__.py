"""Checkpoints: a directory per step with one shard per rank, a manifest of full tensor names and shapes, a SHA-256
per shard, and `latest`, published only after the next step's loss passed the divergence guard.

    save.py          write and publish (two collective steps), prune
    load.py          read on any grid: checksums, shapes, agreed by every rank
    files.py         the layout, the manifest, reading a checkpoint's files
    digest.py        checksums computed while writing, checked before reading
    agree.py         every rank takes the same decision
    lock.py          one run per --save directory
    engine_state.py  what an Engine exports and loads (full tensors, whatever the grid)
    runs.py          a run's checkpoints seen from the training loop: where it starts, when one is published

Imports: config, parallel (placement of split tensors). The Engine imports engine_state from here.
"""
