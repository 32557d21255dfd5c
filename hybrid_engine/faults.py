"""When a rank is lost: every other rank stops, says so, and names it.

A rank killed with SIGKILL (or by the OOM killer, or a segfault) says nothing; the others learn of it only
indirectly, and never by rank:
  - gloo: "Connection reset by peer [10.0.0.3]:41234" (an address) on the ranks talking to it, and on the rest
    a timeout after --comm-timeout seconds; NCCL: a timeout;
  - torchrun: its agent sees the dead worker and sends SIGTERM to every other worker (its own report then
    names the failed rank and exit code), and restarts them all when --max-restarts allows.

`Heartbeat` is what lets a survivor name the lost rank itself: every rank ticks a counter in the rendezvous
store (the key/value server that torchrun's agent, or rank 0 without torchrun, already runs) twice a second from
a daemon thread, and notes its own exit when it leaves on purpose. On failure a survivor watches the counters
for a moment: a rank that stopped ticking and left no exit note was lost. (Without torchrun the store lives in
rank 0, so when rank 0 is the one lost the survivors can only say the store went with it.)

`SigtermReporter` makes SIGTERM (torchrun's way of stopping the survivors) print that line too. A Python signal
handler runs only when the main thread returns to the interpreter, which a rank blocked in a collective may not
do for --comm-timeout seconds; so the handler only wakes a thread (signal.set_wakeup_fd), and the thread
reports and exits at once.

Test hooks (environment variables read by the driver; they fire only on a run's first attempt, i.e. when
torchrun's TORCHELASTIC_RESTART_COUNT is 0 or unset, so a restarted run does not fail again):
  HYBRID_ENGINE_TEST_KILL_AT_STEP=S     rank HYBRID_ENGINE_TEST_KILL_RANK (default 0) SIGKILLs itself as step
                                        S begins (the others are then blocked mid-step, waiting for it)
  HYBRID_ENGINE_TEST_CRASH_IN_SAVE=S    that rank writes half its shard of the checkpoint of step S, then
                                        SIGKILLs itself
  HYBRID_ENGINE_TEST_NAN_AT_STEP=S      a NaN is written into the inputs of step S (so the loss is NaN)
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time

HOOK_PREFIX = "HYBRID_ENGINE_TEST_"


def hook_fires(name: str, step: int, rank: int | None = None) -> bool:
    """True when HYBRID_ENGINE_TEST_<name> == step on a first attempt (and, if `rank` is given, this is the
    hook's rank, HYBRID_ENGINE_TEST_KILL_RANK)."""
    raw = os.environ.get(HOOK_PREFIX + name)
    if raw is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return False
    if rank is not None and rank != int(os.environ.get(HOOK_PREFIX + "KILL_RANK", "0")):
        return False
    return int(raw) == step


def say(line: str) -> None:
    """One line on stderr in one write(2): ranks sharing a pipe (torchrun) never interleave inside a line."""
    sys.stderr.flush()
    os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))


def kill_self() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Heartbeat:
    """Ticks this rank's counter in the rendezvous store and keeps watching everyone's; tells which peers went
    silent without an exit note. Disabled (every method a no-op) for one rank or without MASTER_ADDR/PORT.

    The thread also keeps what it last saw, so a survivor can still name the lost rank after the store itself is
    gone (without torchrun the store lives in rank 0, which may have left already). Store traffic: one add and
    one multi_get of 2 x world keys per tick per rank; fine for the tens to hundreds of ranks this engine runs.
    """

    def __init__(self, rank: int, world_size: int, interval_s: float = 0.25):
        self.rank, self.world_size, self.interval_s = rank, world_size, interval_s
        self.host, self.port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        attempt = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"hybrid_engine/heartbeat/{attempt}/"
        self.enabled = world_size > 1 and bool(self.host and self.port)
        # Without torchrun, rank 0's process serves the store (torchrun's agent serves it otherwise).
        self.hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats: list[int] = [0] * world_size
        self._changed: list[float] = [0.0] * world_size  # when each peer's counter last moved (monotonic)
        self._exited: list[bool] = [False] * world_size
        self._last_read = 0.0
        self._store_alive = False

    def _client(self):
        import torch.distributed as dist

        return dist.TCPStore(self.host, int(self.port), self.world_size, is_master=False,
                             timeout=datetime.timedelta(seconds=5), wait_for_workers=False)

    def _keys(self) -> list[str]:
        return [f"{self.prefix}{kind}/{r}" for kind in ("beat", "exit") for r in range(self.world_size)]

    def start(self) -> "Heartbeat":
        if self.enabled:
            self._changed = [time.monotonic()] * self.world_size
            self._thread = threading.Thread(target=self._tick, name="hybrid_engine-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        try:
            store = self._client()  # its own connection: the main thread's store calls never wait on ours
            keys = self._keys()
            for key in keys:
                store.add(key, 0)  # exist from now on, so multi_get never waits for a late rank's first tick
            self._store_alive = True
            while not self._stop.is_set():
                store.add(f"{self.prefix}beat/{self.rank}", 1)
                values = [int(v) for v in store.multi_get(keys)]
                now = time.monotonic()
                with self._lock:
                    for r in range(self.world_size):
                        if values[r] != self._beats[r]:
                            self._beats[r], self._changed[r] = values[r], now
                        self._exited[r] = values[self.world_size + r] > 0
                    self._last_read = now
                self._stop.wait(self.interval_s)
        except Exception:  # noqa: BLE001 - the store is gone: keep what was last seen
            self._store_alive = False

    def stop(self) -> None:
        """End the thread before the interpreter exits: a thread caught inside a store call at exit aborts the
        process ("terminate called without an active exception")."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def note_exit(self) -> None:
        """This rank leaves on purpose (done, bad input, or reporting a failure): it was not lost."""
        if self.enabled:
            try:
                self._client().add(f"{self.prefix}exit/{self.rank}", 1)
            except Exception:  # noqa: BLE001
                pass

    def silent_ranks(self, watch_s: float = 2.0, silence_s: float = 1.0) -> list[int]:
        """Peers whose counter has not moved for `silence_s` seconds (four ticks) and that left no exit note:
        lost (killed, crashed, out of memory). Watches for `watch_s` first while the store is up; a live peer
        ticks several times meanwhile, a dead one never again."""
        if self._thread is None:
            return []
        if self._store_alive:
            time.sleep(watch_s)
        with self._lock:
            return [r for r in range(self.world_size)
                    if r != self.rank and not self._exited[r] and self._changed[r] <= self._last_read - silence_s]

    def describe_loss(self) -> str | None:
        """'lost rank 3 (...)' after watching the peers for a moment; None if no peer was found lost (or this
        rank never started its heartbeat: it failed before the process group existed)."""
        if self._thread is None:
            return None
        lost = self.silent_ranks()
        gone = "" if self._store_alive else " (the rendezvous store is gone too)"
        if lost:
            return (f"lost rank {', '.join(map(str, lost))} (no heartbeat and no exit note: killed, crashed, out of "
                    f"memory or frozen){gone}")
        if not self._store_alive:
            return ("the rendezvous store is unreachable (without torchrun it lives in rank 0, so rank 0 was "
                    "probably lost)")
        return None

    def linger(self) -> None:
        """Before leaving after a failure: if this process serves the store, give the others a moment to read it."""
        if self.enabled and self.hosts_store:
            time.sleep(4 * self.interval_s + 1.0)


class SigtermReporter:
    """On SIGTERM, print one line naming the lost rank and exit 143 at once, even if the main thread is
    blocked in a collective. After `leaving()` (this rank is exiting on its own) a SIGTERM exits silently."""

    def __init__(self, rank: int, heartbeat: Heartbeat | None = None):
        self.rank = rank
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._leaving_code: int | None = None
        self._reported = False

    def install(self) -> "SigtermReporter":
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.signal(signal.SIGTERM, lambda *_: None)  # the C-level handler writes to write_fd; the thread acts
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_fd,), name="hybrid_engine-sigterm", daemon=True).start()
        return self

    def leaving(self, code: int) -> bool:
        """Claim the exit for the main thread; False if the SIGTERM thread already reports (and exits)."""
        with self._lock:
            if self._leaving_code is not None:
                return False
            self._leaving_code = code
            return True

    def reported(self) -> None:
        """The main thread has printed its line: a SIGTERM from now on just exits with its code."""
        self._reported = True

    def _watch(self, read_fd: int) -> None:
        while signal.SIGTERM not in os.read(read_fd, 64):
            pass
        if not self.leaving(143):
            if self._reported:  # the main thread has said what happened (e.g. waiting for peers to say it too)
                os._exit(self._leaving_code)
            return  # the main thread is writing its report; let it finish
        why = "the launcher stopped this rank with SIGTERM (torchrun does so when another rank fails)"
        if self.heartbeat is not None:
            self.heartbeat.note_exit()
            lost = self.heartbeat.describe_loss()
            why = f"{lost}; {why}" if lost else why
        say(f"hybrid_engine: rank {self.rank}: stopped: {why}")
        sys.stdout.flush()
        os._exit(143)
