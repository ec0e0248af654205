"""Ctrl-C and SIGTERM during training: one line and a resumable run, never a traceback.

`sigterm_raises()` (files/interruptions.py, shared with every command that writes) makes SIGTERM
raise `Terminated` (a KeyboardInterrupt) in the main thread, as Ctrl-C raises KeyboardInterrupt,
so that the loop's cleanup runs for both: the checkpoint save
in flight finishes, Orbax's temporary directories are removed, and the loop raises
`TrainingInterrupted` with the step reached and the last checkpoint. The training CLI prints
its message and exits 130 (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number. (A
process of a multi-process run still dies of SIGTERM at once, as the launcher expects.)
"""

from __future__ import annotations

from flax_transformer.files.interruptions import (  # noqa: F401  (the training names)
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    exit_status,
    sigterm_raises,
)


class TrainingInterrupted(KeyboardInterrupt):
    """The run stopped on Ctrl-C or SIGTERM; its message says where and what --resume does."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


def interrupted(err: KeyboardInterrupt, step: int, last_checkpoint: int | None, workdir):
    """The TrainingInterrupted for a run stopped by `err` after `step` optimizer steps."""
    if last_checkpoint is None:
        where = "no checkpoint was saved yet; --resume starts the run over with its settings"
    else:
        where = f"the last checkpoint is step {last_checkpoint}; --resume continues"
    return TrainingInterrupted(f"interrupted at step {step}: {where}", exit_status(err))
