"""Leave together on a configuration error.

torchrun ends every worker as soon as the first one exits. A bad configuration is found by every rank, but
ranks reach the check at different times (importing torch takes seconds on a loaded machine), so the first
rank to exit would kill the others before they could say what is wrong. Each failing rank therefore checks
in at torchrun's rendezvous store (a key/value server the launcher already runs; no process group and no
collective is involved) and exits once every rank has checked in, or after a short grace period.
"""
from __future__ import annotations

import datetime
import os
import time


def wait_for_all_ranks(rank: int, world_size: int, grace_s: float = 20.0) -> None:
    """Return once all `world_size` ranks have called this, or after `grace_s` (never blocks longer)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if world_size <= 1 or not host or not port:
        return
    deadline = time.monotonic() + grace_s
    try:
        import torch.distributed as dist

        store = dist.TCPStore(host, int(port), world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=grace_s), wait_for_workers=False)
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        key = f"hybrid_engine/config_error/{run}"
        arrived = store.add(key, 1)
        while arrived < world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            arrived = store.add(key, 0)
    except Exception:  # noqa: BLE001 - no store reachable: nothing to coordinate with, just leave
        return
