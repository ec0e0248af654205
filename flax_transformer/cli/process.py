"""How a command's process ends: `exit_process(main())` in every `if __name__ == "__main__"`."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from flax_transformer.files.interruptions import EXIT_SIGINT, EXIT_SIGTERM


def exit_process(status) -> NoReturn:
    """sys.exit(status); after an interruption (exit 130 / 143) the process ends at once
    instead (stdout and stderr flushed, then os._exit), without Python's teardown. A run
    stopped while XLA compiles or runs a step still has XLA threads at work, and finalizing
    the interpreter under them crashed the process (SIGSEGV, exit -11) after its one line was
    said (bench.chaos found it). Every file was closed by the command's own cleanup already.
    Any other status: the signals are ignored from here on, so that the status is the one
    returned."""
    if status in (EXIT_SIGINT, EXIT_SIGTERM):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    # The work is done: a Ctrl-C or SIGTERM during the teardown would kill the process with the
    # signal (Python restores the default actions as it finalizes; ignored ones it leaves).
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    sys.exit(status)
