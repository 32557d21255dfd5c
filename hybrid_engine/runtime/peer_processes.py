"""Ending a frozen peer: the process of a rank that stopped (SIGSTOP, a debugger) and that nobody else will end.

A frozen rank cannot end itself, and torchrun's agent, once a survivor has left, sends it SIGTERM, which a
stopped process does not act on, then waits 30 s before SIGKILL; without a launcher nobody ends it at all. So
every rank publishes who its process is (`identity`: boot id, pid and start time, through the heartbeat's
store), and a survivor that finds a peer lost ends it with SIGKILL when it can tell for sure that it is that
process and that it is stopped: the same machine (boot id), the same process (pid and start time, so a reused
pid is never hit) and the stopped state ('T' or 't' in /proc/PID/stat). A peer on another machine is ended by
a survivor on its own machine, or by its launcher.
"""
from __future__ import annotations

import os
import signal
import sys


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks) of process `pid`, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]  # fields 3 and 22 of proc(5), counted after the command name


def identity() -> str:
    """'BOOT_ID PID START' of this process ('' where /proc cannot tell)."""
    boot, own = _boot_id(), _stat(os.getpid())
    return f"{boot} {os.getpid()} {own[1]}" if boot and own else ""


def frozen_pid(peer: str | None) -> int | None:
    """The pid of process `peer` (an identity) when it is on this machine and stopped, else None."""
    try:
        boot, pid, start = (peer or "").split()
        pid = int(pid)
    except ValueError:
        return None
    if boot != _boot_id() or pid == os.getpid():
        return None
    now = _stat(pid)
    if now is None or now[1] != start or now[0] not in ("T", "t"):
        return None
    return pid


def end_if_frozen(peer: str | None) -> int | None:
    """SIGKILL the process `peer` (an identity) if it is on this machine and stopped; its pid when it was ended."""
    pid = frozen_pid(peer)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGKILL)  # a stopped process cannot act on SIGTERM; SIGKILL ends it as it is
    except OSError:
        return None
    return pid


class FrozenPeers:
    """The stopped peers a rank names in its failure line, ended as it leaves, after the line: its stderr is closed
    first, since every connection to a killed peer (rank 0 serves the store) then fails in c10d's threads with a
    C++ stack each, which would follow the one line that says what happened."""

    def __init__(self):
        self._found: list[str] = []  # their identities

    def name(self, ranks: list[int], procs: list[str]) -> str:
        """'; ended frozen rank R (pid P, ...) with SIGKILL' for each of `ranks` whose process (procs[rank], an
        identity) is stopped on this machine; they are ended by end()."""
        found = [(r, pid) for r in ranks if (pid := frozen_pid(procs[r])) is not None]
        self._found.extend(procs[r] for r, _ in found)
        return "".join(f"; ended frozen rank {r} (pid {pid}, stopped on this machine) with SIGKILL" for r, pid in found)

    def end(self) -> None:
        if not self._found:
            return
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # C++ logs included: nothing more reaches this process's stderr
        os.close(devnull)
        for peer in self._found:
            end_if_frozen(peer)
