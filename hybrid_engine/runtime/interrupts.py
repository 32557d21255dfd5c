"""Ctrl-C (SIGINT): one line per rank, no traceback, exit 130, even while the main thread waits in a collective.

A Python signal handler runs only when the main thread returns to the interpreter, which a rank blocked in a
collective may not do for --comm-timeout seconds; and a KeyboardInterrupt raised wherever the main thread happens
to be unwinds through gloo and torch with a traceback each. So SIGINT is blocked in every thread and a thread of
its own waits for it (`signal.sigwait`), prints

    hybrid_engine: rank 3: interrupted at step 41; last checkpoint runs/ckpt/step_000040

and exits 130. SIGTERM stays with faults.SigtermReporter (exit 143); whichever signal comes first claims the exit
through the reporter (`leaving`), so a rank prints one line, never two.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from . import faults


class InterruptReporter:
    def __init__(self, rank: int, reporter: faults.SigtermReporter, heartbeat: faults.Heartbeat | None, state):
        self.rank, self.reporter, self.heartbeat, self.state = rank, reporter, heartbeat, state

    def install(self) -> "InterruptReporter":
        """Call before other threads start: they inherit the blocked SIGINT, so only our thread receives it. A
        thread that existed before (none of ours) may still take it; the handler then reports the same way."""
        if threading.current_thread() is not threading.main_thread():
            return self  # signals belong to the main thread (an embedding caller runs without this)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, lambda *_: self.report())
        threading.Thread(target=self._wait, name="hybrid_engine-sigint", daemon=True).start()
        return self

    def _wait(self) -> None:
        signal.sigwait({signal.SIGINT})
        self.report()

    def report(self) -> None:
        """One line and exit 130, unless another exit (an error, a SIGTERM) is already being reported."""
        if not self.reporter.leaving(130):
            return
        if self.heartbeat is not None:
            self.heartbeat.note_exit()  # interrupted on purpose: the others must not call this rank lost
        faults.say(f"hybrid_engine: rank {self.rank}: interrupted {self.state.describe()}")
        sys.stdout.flush()
        if self.heartbeat is not None:
            # Without torchrun this process may serve the store: stay a moment, so that the other ranks (also
            # interrupted) leave their exit notes instead of c10d's connection-reset warnings.
            self.heartbeat.linger()
        os._exit(130)
