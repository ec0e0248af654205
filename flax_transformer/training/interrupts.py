"""Ctrl-C and SIGTERM during training: one line and a resumable run, never a traceback.

`sigterm_raises()` makes SIGTERM raise `Terminated` (a KeyboardInterrupt) in the main thread, as
Ctrl-C raises KeyboardInterrupt, so that the loop's cleanup runs for both: the checkpoint save
in flight finishes, Orbax's temporary directories are removed, and the loop raises
`TrainingInterrupted` with the step reached and the last checkpoint. The training CLI prints
its message and exits 130 (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number. (A
process of a multi-process run still dies of SIGTERM at once, as the launcher expects.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler `sigterm_raises` installs)."""


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on Ctrl-C or SIGTERM; its message says where and what --resume does."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


def exit_status(err: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM."""
    if isinstance(err, TrainingInterrupted):
        return err.exit_status
    return EXIT_SIGTERM if isinstance(err, Terminated) else EXIT_SIGINT


def interrupted(err: KeyboardInterrupt, step: int, last_checkpoint: int | None, workdir):
    """The TrainingInterrupted for a run stopped by `err` after `step` optimizer steps."""
    if last_checkpoint is None:
        where = (
            f"no checkpoint was saved yet, so there is nothing to resume (delete {workdir} "
            "to start over)"
        )
    else:
        where = f"the last checkpoint is step {last_checkpoint}; --resume continues"
    return TrainingInterrupted(f"interrupted at step {step}: {where}", exit_status(err))


def _raise_terminated(signum, frame):
    distributed = sys.modules.get("flax_transformer.training.distributed")
    if distributed is not None and distributed.joined():
        # One process of a multi-process run: its cleanup would wait on the others (a save in
        # flight is collective), and the launcher stops them all with SIGTERM. End as before.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises():
    """Within: SIGTERM raises Terminated (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
