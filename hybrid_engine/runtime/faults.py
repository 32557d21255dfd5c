"""When a rank is lost: every other rank stops, says so, and names it; nothing waits forever.

A rank killed with SIGKILL (or by the OOM killer, or a segfault) says nothing; the others learn of it only
indirectly, and never by rank:
  - gloo: "Connection reset by peer [10.0.0.3]:41234" (an address) on the ranks talking to it, and on the rest
    a timeout after --comm-timeout seconds; NCCL: a timeout;
  - torchrun: its agent sees the dead worker and sends SIGTERM to every other worker (its own report then
    names the failed rank and exit code), and restarts them all when --max-restarts allows.
A frozen rank (SIGSTOP, a hung driver) looks the same from outside, except that nobody tears the job down:
every process group gives up after --comm-timeout (hybrid_engine/parallel/grid.py), and the heartbeat names it. A frozen
rank's process on the survivor's own machine is then ended with SIGKILL (runtime/peer_processes.py), so the whole job
ends within --comm-timeout and a few seconds (torchrun's SIGTERM would wait 30 s more on a stopped process).

`Heartbeat` is what lets a survivor name the lost rank itself: every rank ticks a counter in the rendezvous
store (the key/value server that torchrun's agent, or rank 0 without torchrun, already runs) four times a second
from a daemon thread, and notes its own exit when it leaves on purpose (with why: done or reporting a failure,
or stopped by SIGTERM). On failure a survivor watches the counters for a moment: a rank that stopped ticking and
left no exit note was lost; a rank whose note says SIGTERM is named as stopped by it. (Without torchrun the store
lives in rank 0, so when rank 0 is the one lost the survivors can only say the store went with it.)
Under torchrun the heartbeat also watches the launcher: when torchrun's agent dies (SIGKILL), its workers would
otherwise train on; each says so and exits once its parent process is gone or the agent's store has not
answered for --comm-timeout seconds.

A TCPStore client blocks forever, whatever its timeout, on a server that accepts connections and never answers
(a frozen rank 0, another program on MASTER_PORT), in connecting and in every call. So every store connection
made here is bounded (`store_client`, `rendezvous_store`), and a survivor judges the store by when it last
answered, never by waiting on it.

`SigtermReporter` makes SIGTERM (torchrun's way of stopping the survivors, or anyone's `kill`) print one line
too. A Python signal handler runs only when the main thread returns to the interpreter, which a rank blocked in a
collective may not do for --comm-timeout seconds; so the handler only wakes a thread (signal.set_wakeup_fd), and
the thread reports and exits at once.

The test hooks that kill a rank or poison a step are hybrid_engine/runtime/fault_plan.py's; `kill_self` is how they
kill.
"""
from __future__ import annotations

import datetime
import os
import re
import signal
import sys
import threading
import time

from .peer_processes import FrozenPeers, identity


def say(line: str) -> None:
    """One line on stderr in one write(2): ranks sharing a pipe (torchrun) never interleave inside a line. On a
    terminal the line starts at the beginning of the row, erasing it: rank 0's live status line
    (train/progress.py) or the terminal's echoed ^C may hold the cursor mid-row, and any rank may speak first."""
    sys.stderr.flush()
    start = "\r\x1b[K" if os.isatty(2) else ""
    os.write(2, (start + line.rstrip("\n") + "\n").encode(errors="replace"))


def kill_self() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def freeze_self() -> None:
    """Stop this process (SIGSTOP) as a hung driver would: it neither answers nor exits until SIGCONT or SIGKILL."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)


EXIT_LEFT, EXIT_SIGTERM = 1, 2  # exit notes: left on purpose (done, or reporting a failure); stopped by SIGTERM


class RendezvousError(Exception):
    """The rendezvous store cannot be reached or served; the message is the whole line for the user."""


class JoinTimeout(RuntimeError):
    """The store answers, but not every rank joined the process group in time; the message is the whole line."""


def uses_agent_store() -> bool:
    """torchrun's agent serves the rendezvous store (else rank 0's process does)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def serves_store(rank: int) -> bool:
    """Whether this rank's process serves the rendezvous store, so that its exit closes it: rank 0's, unless
    torchrun's agent serves it."""
    return rank == 0 and not uses_agent_store()


def bounded(fn, timeout_s: float):
    """fn() on a daemon thread; TimeoutError once `timeout_s` passes without it returning. The thread is left
    behind, blocked: for calls (a TCPStore connect or request) that nothing else can interrupt."""
    box: dict = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=call, name="hybrid_engine-store", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def store_client(host: str, port: int, world_size: int, timeout_s: float):
    """A client of the TCPStore at host:port, or RendezvousError within about `timeout_s` seconds."""
    import torch.distributed as dist

    def connect():
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    where = f"cannot reach the rendezvous store at {host}:{port} within {timeout_s:g} s"
    try:
        return bounded(connect, timeout_s + 1.0)
    except TimeoutError:
        raise RendezvousError(f"{where} (something there accepts connections but never answers: is MASTER_PORT "
                              "held by another program?)") from None
    except Exception:  # noqa: BLE001 - refused or reset until the timeout
        raise RendezvousError(f"{where} (nothing answers there: is its server up, and MASTER_ADDR and MASTER_PORT "
                              "the same on every rank?)") from None


def rendezvous_store(rank: int, world_size: int, timeout_s: float):
    """The store init_process_group meets on, within `timeout_s` or a RendezvousError: a client of torchrun's agent
    store, or without torchrun rank 0 serves it on MASTER_PORT and the others connect. None for one rank without
    torchrun (it needs no peer: the caller keeps a store in its own process)."""
    import torch.distributed as dist

    if world_size == 1 and not uses_agent_store():
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        raise RendezvousError(f"MASTER_ADDR and MASTER_PORT must name the rendezvous store (torchrun sets them), got "
                              f"MASTER_ADDR={host!r} MASTER_PORT={port!r}")
    if not serves_store(rank):
        return store_client(host, int(port), world_size, timeout_s)
    try:
        return dist.TCPStore(host, int(port), world_size, is_master=True,
                             timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - the port is taken (or the address is not this host's)
        found = re.search(r"message: (.+)$", str(exc).splitlines()[0] if str(exc) else "")
        reason = found.group(1) if found else type(exc).__name__
        raise RendezvousError(f"cannot serve the rendezvous store on MASTER_PORT {port} ({reason}): is MASTER_PORT "
                              "held by another program?") from None


class Heartbeat:
    """Ticks this rank's counter in the rendezvous store and keeps watching everyone's; tells which peers went
    silent without an exit note. Disabled (every method a no-op) for one rank or without MASTER_ADDR/PORT. Under
    torchrun it also ends this rank when the launcher is gone (see the module docstring).

    The thread also keeps what it last saw, so a survivor can still name the lost rank after the store itself is
    gone (without torchrun the store lives in rank 0, which may have left already) or stopped answering (a frozen
    rank 0). Store traffic: one add and one multi_get of 2 x world keys per tick per rank; fine for the tens to
    hundreds of ranks this engine runs.
    """

    def __init__(self, rank: int, world_size: int, interval_s: float = 0.25):
        self.rank, self.world_size, self.interval_s = rank, world_size, interval_s
        self.host, self.port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        attempt = os.environ.get("TORCHELASTIC_RUN_ID", "run") + "/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"hybrid_engine/heartbeat/{attempt}/"
        self.enabled = world_size > 1 and bool(self.host and self.port and self.port.isdigit())
        # Without torchrun, rank 0's process serves the store (torchrun's agent serves it otherwise).
        self.hosts_store = serves_store(rank)
        # torchrun's agent is this process's parent: when that changes, the agent is gone (checked from start())
        self.launcher_pid = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self.reporter: SigtermReporter | None = None  # who claims this rank's exit (set by SigtermReporter)
        self.timeout_s = 60.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats: list[int] = [0] * world_size
        self._changed: list[float] = [0.0] * world_size  # when each peer's counter last moved (monotonic)
        self._exited: list[int] = [0] * world_size  # each peer's exit note (EXIT_*; 0: none)
        self._last_read = 0.0  # when the store last answered (monotonic)
        self._procs: list[str] = [""] * world_size  # each rank's process (peer_processes.identity)
        self._frozen = FrozenPeers()  # the stopped peers describe_loss named

    def _client(self, timeout_s: float = 5.0):
        return store_client(self.host, int(self.port), self.world_size, timeout_s)

    def _keys(self) -> list[str]:
        return [f"{self.prefix}{kind}/{r}" for kind in ("beat", "exit") for r in range(self.world_size)]

    def start(self, timeout_s: float = 60.0) -> "Heartbeat":
        """Start ticking; `timeout_s` (--comm-timeout) is how long torchrun's store may stay silent before this
        rank takes the launcher for gone."""
        self.timeout_s = timeout_s
        now = time.monotonic()
        self._changed, self._last_read = [now] * self.world_size, now  # the store just answered (the rendezvous)
        if self.enabled:
            self._thread = threading.Thread(target=self._tick, name="hybrid_engine-heartbeat", daemon=True)
            self._thread.start()
        if self.launcher_pid is not None:
            threading.Thread(target=self._watch_launcher, name="hybrid_engine-launcher", daemon=True).start()
        return self

    def _tick(self) -> None:
        try:
            store = self._client()  # its own connection: the main thread's store calls never wait on ours
            keys = self._keys()
            for key in keys:
                store.add(key, 0)  # exist from now on, so multi_get never waits for a late rank's first tick
            procs = [f"{self.prefix}proc/{r}" for r in range(self.world_size)]
            store.set(procs[self.rank], identity())  # who this process is, for ending it if it freezes
            while not self._stop.is_set():
                store.add(f"{self.prefix}beat/{self.rank}", 1)
                values = [int(v) for v in store.multi_get(keys)]
                if not all(self._procs) and store.check(procs):  # every rank has said who it is
                    self._procs = [v.decode(errors="replace") for v in store.multi_get(procs)]
                now = time.monotonic()
                with self._lock:
                    for r in range(self.world_size):
                        if values[r] != self._beats[r]:
                            self._beats[r], self._changed[r] = values[r], now
                        self._exited[r] = values[self.world_size + r]
                    self._last_read = now
                self._stop.wait(self.interval_s)
        except Exception:  # noqa: BLE001 - the store is gone: keep what was last seen (its silence is the signal)
            pass

    def store_answers(self, within_s: float | None = None) -> bool:
        """The store answered this rank's heartbeat within `within_s` seconds (default: four ticks and a second)."""
        within_s = 4 * self.interval_s + 1.0 if within_s is None else within_s
        return time.monotonic() - self._last_read < within_s

    def launcher_gone(self) -> str | None:
        """Why torchrun's agent is taken for gone ('torchrun was killed', ...), or None (or not under torchrun)."""
        if self.launcher_pid is None:
            return None
        if os.getppid() != self.launcher_pid:  # re-parented to init or a subreaper: the agent died
            return "torchrun was killed"
        # the store's silence means something only once this rank has heard from it (start(): the rendezvous);
        # a rank that fails before then (a bad --config) has simply not asked it yet
        started = self._thread is not None
        if self.enabled and started and uses_agent_store() and not self.store_answers(self.timeout_s):
            return f"its rendezvous store has not answered for {self.timeout_s:g} s"
        return None

    def _watch_launcher(self) -> None:
        """Nobody will stop this rank once the launcher is gone (no agent to send SIGTERM, no store to rendezvous a
        restart): stop, saying so once. A checkpoint being written is left as the atomic save leaves any crash."""
        why = None
        while why is None:
            if self._stop.wait(self.interval_s):
                return  # this rank is done
            why = self.launcher_gone()
        if self.reporter is not None and not self.reporter.leaving(1):
            return  # the main thread is leaving on its own and says why (describe_loss names the launcher too)
        say(f"hybrid_engine: rank {self.rank}: the launcher is gone ({why}); stopping")
        sys.stdout.flush()
        os._exit(1)

    def stop(self) -> None:
        """End the thread before the interpreter exits: a thread caught inside a store call at exit aborts the
        process ("terminate called without an active exception")."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def note_exit(self, why: int = EXIT_LEFT) -> None:
        """This rank leaves on purpose (EXIT_LEFT: done, bad input, or reporting a failure; EXIT_SIGTERM): it was
        not lost. Bounded: the store may be gone or frozen."""
        if self._thread is None or not self.store_answers() or self.launcher_gone():
            return  # never ticked (no peer is watching for this rank's note), or nobody would read it
        try:
            bounded(lambda: self._client(2.0).set(f"{self.prefix}exit/{self.rank}", str(why)), 3.0)
        except Exception:  # noqa: BLE001
            pass

    def silent_ranks(self, watch_s: float = 2.0, silence_s: float = 1.0) -> list[int]:
        """Peers whose counter has not moved for `silence_s` seconds (four ticks) and that left no exit note:
        lost (killed, crashed, out of memory, frozen). Watches for `watch_s` first while the store answers; a live
        peer ticks several times meanwhile, a dead or frozen one never again."""
        if self._thread is None:
            return []
        if self.store_answers():
            time.sleep(watch_s)
        with self._lock:
            return [r for r in range(self.world_size)
                    if r != self.rank and not self._exited[r] and self._changed[r] <= self._last_read - silence_s]

    def departed(self) -> list[int]:
        """Peers no failure report will come from: lost (silent with no exit note, judged on what was last seen) or
        stopped by SIGTERM. (A rank reporting a failure notes its exit first, so that note alone says nothing.)"""
        lost = set(self.silent_ranks(watch_s=0.0))
        with self._lock:
            return sorted(lost | {r for r in range(self.world_size) if self._exited[r] == EXIT_SIGTERM})

    def describe_loss(self) -> str | None:
        """'lost rank 3 (...)' and/or 'rank 1 stopped by SIGTERM' after watching the peers for a moment, or 'the
        launcher is gone (...)'; None if no peer was found lost (or this rank never started its heartbeat: it failed
        before the process group existed)."""
        launcher = self.launcher_gone()
        if launcher is not None:  # its workers then fail one after another: that is not for them to name
            return f"the launcher is gone ({launcher})"
        if self._thread is None:
            return None
        lost = self.silent_ranks()
        with self._lock:
            sigtermed = [r for r in range(self.world_size) if r != self.rank and self._exited[r] == EXIT_SIGTERM]
        answers = self.store_answers()
        parts = []
        if lost:
            parts.append(f"lost rank {', '.join(map(str, lost))} (no heartbeat and no exit note: killed, crashed, "
                         "out of memory or frozen)")
        if sigtermed:
            parts.append(f"rank {', '.join(map(str, sigtermed))} stopped by SIGTERM")
        if parts:
            return "; ".join(parts) + ("" if answers else " (the rendezvous store is gone too)") + self._end_frozen(lost)
        if not answers:
            if uses_agent_store():
                return "the rendezvous store is unreachable (torchrun's agent serves it)"
            return ("the rendezvous store is unreachable (without torchrun it lives in rank 0, so rank 0 was "
                    "probably lost)" + self._end_frozen([0]))
        return None

    def _end_frozen(self, ranks: list[int]) -> str:
        """Those of `ranks` whose process is stopped on this machine, to be ended by end_frozen; what will be done."""
        return self._frozen.name(ranks, self._procs)

    def end_frozen(self) -> None:
        """End the stopped peers describe_loss named, as this rank leaves, its line said."""
        self._frozen.end()

    def linger(self) -> None:
        """Before leaving after a failure: if this process serves the store, give the others a moment to read it."""
        if self.enabled and self.hosts_store:
            time.sleep(4 * self.interval_s + 1.0)


class SigtermReporter:
    """On SIGTERM, print one line (what this rank received, and any peer found lost) and exit 143 at once, even if
    the main thread is blocked in a collective. After `leaving()` (this rank is exiting on its own) a SIGTERM
    exits silently. The line does not say who sent the signal: a rank cannot know (torchrun sends it to every
    rank once one fails, but so does a user's `kill`)."""

    def __init__(self, rank: int, heartbeat: Heartbeat | None = None, where=None):
        self.rank = rank
        self.heartbeat = heartbeat
        self.where = where  # () -> (long, short) description of the step's wait, or None (runtime/hang_report.py)
        if heartbeat is not None:
            heartbeat.reporter = self
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
        why = "received SIGTERM"
        if self.heartbeat is not None:
            self.heartbeat.note_exit(EXIT_SIGTERM)
            lost = self.heartbeat.describe_loss()
            if lost:
                why = f"{lost}; {why}" + (" (torchrun sends it to every rank once one fails)"
                                          if self.heartbeat.launcher_pid is not None else "")
        where = self.where() if self.where is not None else None
        if where is not None:
            why += f" while {where[0]}"
        say(f"hybrid_engine: rank {self.rank}: stopped: {why}")
        sys.stdout.flush()
        if self.heartbeat is not None:
            self.heartbeat.end_frozen()
        os._exit(143)
