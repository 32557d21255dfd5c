"""`python -m hybrid_engine.launch ...`: torchrun with the same arguments, minus its noise.

torchrun (torch.distributed.run) is the launcher users know, so this module reuses it whole: the same
arguments, the same rendezvous, the same agent that starts, watches and stops the ranks. What it changes is what
the shell sees after the ranks have said what happened (each rank prints its own one line):

- Ctrl-C or SIGTERM: torchrun's agent forwards the signal to the ranks and then raises `SignalException`, which
  torchrun prints as a ~30-line traceback. Here it ends quietly with 130 (SIGINT) or 143 (SIGTERM).
- A rank that failed: torchrun prints a `FAILED` report and exits 1 whatever the rank's code. Here the exit code is
  the first failed rank's own (2 for a bad flag, 1 for a failure), and a line is printed only when that rank was
  killed by a signal, since then nothing else names it.
- torchrun's warnings (the OMP_NUM_THREADS banner, "Sending process ... closing signal") are not printed.
"""
import logging
import os
import signal
import sys

def _quiet_torchrun_logs() -> None:
    # torch's elastic loggers take their level from LOGLEVEL when they are created (on import), and each sets its
    # own level, so a parent logger's level would not reach them. The ranks inherit LOGLEVEL too; nothing of ours
    # reads it.
    os.environ.setdefault("LOGLEVEL", "CRITICAL")
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(os.environ["LOGLEVEL"])


def exit_code_of_signal(sig: int) -> int:
    """The shell's convention: a process ended by signal N exits 128 + N."""
    return 128 + int(sig)


def main(argv=None) -> int:
    _quiet_torchrun_logs()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed import run as torchrun

    _quiet_torchrun_logs()  # the loggers the imports above just created
    args = torchrun.parse_args(argv)
    try:
        torchrun.run(args)
    except SignalException as stop:
        # The agent has already passed the signal on to every rank and waited for them.
        return exit_code_of_signal(stop.sigval)
    except KeyboardInterrupt:
        return exit_code_of_signal(signal.SIGINT)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        if failure.exitcode < 0:
            sig = -failure.exitcode
            print(f"hybrid_engine: launch: rank {rank} was killed by {signal.Signals(sig).name} "
                  f"(pid {failure.pid}); the other ranks were stopped", file=sys.stderr)
            return exit_code_of_signal(sig)
        return failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main())
