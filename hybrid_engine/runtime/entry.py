"""How every command but the driver ends when its user stops it: the one rule for `plan`, `schedule`, `sample`,
`hf`, `data` (the driver's ranks have their own, runtime/interrupts.py, since a rank may wait in a collective).

    Ctrl-C (KeyboardInterrupt)          one line, `PROG: interrupted`, exit 130, no traceback
    a reader that left (`... | head`)   nothing more is written or said, exit 141 (128 + SIGPIPE, as `yes | head`)
"""
from __future__ import annotations

import os
import sys
from typing import Callable

from . import faults

INTERRUPTED = 130
PIPE_CLOSED = 141


def run_command(prog: str, main: Callable[[], int]) -> int:
    """main()'s exit code, or the code of the way out above."""
    try:
        code = main()
        sys.stdout.flush()  # a closed pipe shows here for output still buffered
        return code
    except KeyboardInterrupt:
        faults.say(f"{prog}: interrupted")  # at the start of its row on a terminal, past the echoed ^C
        return INTERRUPTED
    except BrokenPipeError:
        return pipe_closed()


def pipe_closed() -> int:
    """stdout's reader is gone: point stdout at nothing, so that the interpreter's final flush of the rest of the
    buffer does not fail again ("Exception ignored ... BrokenPipeError"); the exit code to leave with."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return PIPE_CLOSED
