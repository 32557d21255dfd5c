"""When a step hangs, say where: the stage, the action, the peer and the collective each rank was waiting on.

A peer that stops answering (frozen, stuck in its own wait, cut off by the network) shows up on the others as a
collective that times out after --comm-timeout. The pipeline executor records what it runs and what it waits for
(csrc/executor/activity.h); here that record becomes one line per rank, e.g.

    stalled at stage 1, action 1RECV_B0 (needed by 1B0), peer rank 2 (host b), collective recv on the pp gradient
    channel 2->1

printed inside the rank's own failure line (train/cli.py) or SIGTERM line (runtime/faults.py). After a
communication timeout the ranks also check their lines in at the rendezvous store (no process group is trusted any
more) and rank 0 prints them side by side, so the stalled pipeline link or group shows as the end of a chain:

    hybrid_engine: where the ranks waited: rank 0 0RECV_B0 <- rank 1 | rank 1 1RECV_B0 <- rank 2 | rank 2 no report

Everything arrives as plain values (the ranks of this rank's groups, every rank's host), so this module needs no
knowledge of the grid; the record is read through a callable, from any thread.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from . import faults

TIMEOUT_WORDS = ("timed out", "timeout")


@dataclass(frozen=True)
class Placement:
    """Where this rank sits: its global rank, the global ranks of its pipeline (by pp coordinate), of its DP and MP
    groups, and every rank's host."""

    rank: int
    pp_ranks: tuple[int, ...]
    dp_ranks: tuple[int, ...]
    mp_ranks: tuple[int, ...]
    hosts: tuple[str, ...]

    def named(self, ranks) -> str:
        hosts = list(dict.fromkeys(self.hosts[r] for r in ranks))
        return f"ranks {', '.join(map(str, ranks))} (host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})"


def describe(activity: dict | None, where: Placement) -> tuple[str, str] | None:
    """(long, short) description of an executor's activity record (PipelineExecutor.activity()), or None when it
    was not inside a step. The long one starts 'stalled at' for a wait on a peer, 'in' for a compute action."""
    if not activity or not activity.get("in_step"):
        return None
    wait, action, stage = activity["wait"], activity["action"], activity["stage"]
    if wait in ("recv", "send"):
        peer = where.pp_ranks[activity["peer_pp_rank"]]
        mine = where.pp_ranks.index(where.rank)
        awaited = activity["awaited"]
        kind = "activation" if "_F" in awaited else "gradient"  # RECV_F / SEND_F carry activations
        src, dst = (activity["peer_pp_rank"], mine) if wait == "recv" else (mine, activity["peer_pp_rank"])
        needed = f" (needed by {action})" if wait == "recv" and action else ""
        arrow = "<-" if wait == "recv" else "->"
        return (f"stalled at stage {stage}, action {awaited}{needed}, peer rank {peer} (host {where.hosts[peer]}), "
                f"collective {wait} on the pp {kind} channel {src}->{dst}", f"{awaited} {arrow} rank {peer}")
    if wait == "dp_sync":
        return (f"stalled at the end of the pipeline step, collective DP gradient all-reduce / reduce-scatter of "
                f"{where.named(where.dp_ranks)}", f"DP gradient sync of ranks {', '.join(map(str, where.dp_ranks))}")
    if action is None:
        return "at the start of the pipeline step, before its first action", "step start"
    if len(where.mp_ranks) > 1:
        return (f"in stage {stage}, action {action}, collective the stage's MP collectives of "
                f"{where.named(where.mp_ranks)}", f"{action} (MP ranks {', '.join(map(str, where.mp_ranks))})")
    return f"in stage {stage}, action {action} (computing, no collective)", f"{action} (computing)"


class HangReport:
    """This rank's side of the report: what it is waiting on now (`where`), and the check-in after a timeout."""

    def __init__(self, placement: Placement, activity: Callable[[], dict | None]):
        self.placement, self.activity = placement, activity

    def where(self) -> tuple[str, str] | None:
        try:
            return describe(self.activity(), self.placement)
        except Exception:  # noqa: BLE001 - a report must never be the thing that fails
            return None


def is_timeout(message: str) -> bool:
    return any(word in message.lower() for word in TIMEOUT_WORDS)


def _key() -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"hybrid_engine/hang/{run}"


def check_in(rank: int, world_size: int, short: str, lost: list[int], grace_s: float) -> str | None:
    """Leave this rank's short line at the rendezvous store and wait (at most `grace_s`) until every rank not in
    `lost` has left its own; rank 0 returns the summary line, the others None. Bounded throughout: the store may be
    gone or frozen (None then)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if world_size < 2 or not host or not port.isdigit():
        return None
    deadline = time.monotonic() + grace_s

    def exchange() -> str | None:
        store = faults.store_client(host, int(port), world_size, grace_s)
        key = _key()
        store.set(f"{key}/{rank}", short)
        expected = [r for r in range(world_size) if r not in lost]
        names = [f"{key}/{r}" for r in expected]
        while not store.check(names) and time.monotonic() < deadline:
            time.sleep(0.1)
        if rank != 0:
            return None
        parts = []
        for r in range(world_size):
            name = f"{key}/{r}"
            if store.check([name]):
                parts.append(f"rank {r} {store.get(name).decode(errors='replace')}")
            else:
                parts.append(f"rank {r} {'lost' if r in lost else 'no report'}")
        return "hybrid_engine: where the ranks waited: " + " | ".join(parts)

    try:
        return faults.bounded(exchange, grace_s + 2.0)
    except Exception:  # noqa: BLE001 - the store went with a lost rank, or stopped answering
        return None
