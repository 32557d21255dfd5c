"""Leave together on an error every rank finds, and say it once.

torchrun ends every worker as soon as the first one exits. A bad configuration is found by every rank, but
ranks reach the check at different times (importing torch takes seconds on a loaded machine), so the first
rank to exit would kill the others before they could say what is wrong. Each failing rank therefore checks
in at the rendezvous store (a key/value server the launcher, or rank 0, already runs; no process group and no
collective is involved) with its message, and leaves once every rank has checked in, or after a short grace
period. An error every rank found alike is then printed by the lowest of them alone; a rank whose error is its
own prints it, naming itself.
"""
from __future__ import annotations

import datetime
import os
import socket
import time

from . import faults


def _listening(host: str, port: int) -> bool:
    """Whether something accepts connections there (a plain socket: c10d logs a stack for every failed try)."""
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _store(rank: int, world_size: int, deadline: float):
    """(store, started here): the rendezvous store, torchrun's agent's or rank 0's process group's. Ranks started
    by hand that fail before the process group exists find none: rank 0 then serves one on MASTER_PORT itself."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if world_size <= 1 or not host or not port:
        return None, False
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))
    if rank == 0 and not _listening(host, int(port)):
        return dist.TCPStore(host, int(port), world_size, is_master=True, timeout=timeout,
                             wait_for_workers=False), True
    while not _listening(host, int(port)):
        if time.monotonic() > deadline:
            raise TimeoutError("no rendezvous store")
        time.sleep(0.05)
    return dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timeout, wait_for_workers=False), False


def _run_key() -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"hybrid_engine/config_error/{run}"


def agree_on_error(rank: int, world_size: int, message: str, grace_s: float = 20.0) -> tuple[bool, bool]:
    """Check in with `message` and wait until all `world_size` ranks have, or `grace_s` passed (never longer,
    even when the store accepts connections and never answers: a TCPStore client can block forever, see
    hybrid_engine/runtime/faults.py). Returns (speak, alike): whether this rank prints the message (no lower rank checked
    in with the same one), and whether every rank checked in with it. Without a store (one rank, no launcher):
    (True, True)."""
    deadline = time.monotonic() + grace_s
    try:
        return faults.bounded(lambda: _check_in(rank, world_size, message, deadline), grace_s + 1.0)
    except Exception:  # noqa: BLE001 - no store reachable, or it stopped answering: just speak and leave
        return True, False


def answer_the_waiting(rank: int, world_size: int, message: str, grace_s: float = 5.0) -> None:
    """Before the rank whose process serves the store leaves on a failure of its own (a timeout, a lost peer):
    ranks already waiting at the agreement (each with an error of its own) get this rank's check-in, so they stop
    waiting, and read it before the store goes with this process; without it they would lose the connection
    mid-read, and c10d prints a stack for that. Returns at once when no rank waits or another process serves."""
    if world_size <= 1 or not faults.serves_store(rank):
        return
    deadline = time.monotonic() + grace_s

    def check_in_if_waited_for() -> None:
        store, started = _store(rank, world_size, deadline)  # a store started just now has nobody waiting
        if store is not None and not started and store.check([f"{_run_key()}/count"]):
            _check_in(rank, world_size, message, deadline, store)

    try:
        faults.bounded(check_in_if_waited_for, grace_s + 1.0)
    except Exception:  # noqa: BLE001 - the store is gone or stopped answering: nobody left to answer
        pass


def _check_in(rank: int, world_size: int, message: str, deadline: float, store=None) -> tuple[bool, bool]:
    if store is None:
        store, _ = _store(rank, world_size, deadline)
    if store is None:
        return True, True
    served = faults.serves_store(rank)  # its process group's store or the one _store started: it leaves last
    key = _run_key()
    store.set(f"{key}/message/{rank}", message)
    arrived = store.add(f"{key}/count", 1)
    while arrived < world_size and time.monotonic() < deadline:
        time.sleep(0.05)
        arrived = store.add(f"{key}/count", 0)
    same = []
    for r in range(world_size):
        name = f"{key}/message/{r}"
        if r == rank or (store.check([name]) and store.get(name).decode(errors="replace") == message):
            same.append(r)
    # The rank that serves the store leaves last: its exit closes the store, and a rank still reading it would
    # print c10d's connection-lost warning (a slow rank on a loaded machine does).
    read = store.add(f"{key}/read", 1)
    while served and read < arrived and time.monotonic() < deadline:
        time.sleep(0.05)
        read = store.add(f"{key}/read", 0)
    return same[0] == rank, len(same) == world_size
