"""Leave together on a configuration error.

torchrun ends every worker as soon as the first one exits. A bad configuration is found by every rank, but
ranks reach the check at different times (importing torch takes seconds on a loaded machine), so the first
rank to exit would kill the others before they could say what is wrong. Each failing rank therefore checks
in at torchrun's rendezvous store (a key/value server the launcher already runs; no process group and no
collective is involved) and exits once every rank has checked in, or after a short grace period — never
later, even when the store does not answer (a TCPStore client can block forever: see hybrid_engine/faults.py).
"""
from __future__ import annotations

import os
import time

from . import faults


def wait_for_all_ranks(rank: int, world_size: int, grace_s: float = 20.0) -> None:
    """Return once all `world_size` ranks have called this, or after `grace_s` (never blocks longer)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if world_size <= 1 or not host or not port:
        return
    deadline = time.monotonic() + grace_s

    def check_in() -> None:
        store = faults.store_client(host, int(port), world_size, grace_s)
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        key = f"hybrid_engine/config_error/{run}"
        arrived = store.add(key, 1)
        while arrived < world_size and time.monotonic() < deadline:
            time.sleep(0.05)
            arrived = store.add(key, 0)

    try:
        faults.bounded(check_in, grace_s)
    except Exception:  # noqa: BLE001 - no store reachable, or it stopped answering: nothing to coordinate with
        return
