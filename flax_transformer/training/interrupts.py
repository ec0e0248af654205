"""Ctrl-C, SIGTERM and failed writes during training: one line and a resumable run, never a
traceback.

`sigterm_raises()` (files/interruptions.py, shared with every command that writes) makes SIGTERM
raise `Terminated` (a KeyboardInterrupt) in the main thread, as Ctrl-C raises KeyboardInterrupt,
so that the loop's cleanup runs for both: the checkpoint save
in flight finishes, Orbax's temporary directories are removed, and the loop raises
`TrainingInterrupted` with the step reached and the last checkpoint. The training CLI prints
its message and exits 130 (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number. (A
process of a multi-process run still dies of SIGTERM at once, as the launcher expects.)
"""

from __future__ import annotations

from pathlib import Path

from flax_transformer.files.interruptions import (  # noqa: F401  (the training names)
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    exit_status,
    sigterm_raises,
)
from flax_transformer.files.space import out_of_space_message
from flax_transformer.training.checkpoint import CheckpointWriteError, is_disk_full
from flax_transformer.training.run_files import truncate_metrics


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. the loss became NaN); checkpoints already saved are kept."""


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


def write_failed(err: Exception, checkpointer, metrics_path: Path) -> TrainingError:
    """The run stops: metrics.jsonl is cut back to the last good checkpoint (what --resume
    continues from), and one message says what happened (a full disk: which path) and what is
    kept. `err`: a CheckpointWriteError, or an OSError of any other write."""
    try:
        checkpointer.wait()  # a save in flight (an earlier step's) counts once it is complete
    except CheckpointWriteError:
        pass  # it was cut short too: the step before is the last good one
    steps = checkpointer.finished_steps()
    last = steps[-1] if steps else 0
    if isinstance(err, CheckpointWriteError):
        path = checkpointer.directory / str(err.step)
        full = err.disk_full
    else:
        path, full = err.filename or "a file of the run", True  # (only out-of-space comes here)
    what = out_of_space_message(err.__cause__ or err, path) if full else str(err)
    try:
        truncate_metrics(metrics_path, last)
        metrics = f"metrics.jsonl now ends at step {last}"
    except OSError as write_err:
        metrics = f"metrics.jsonl could not be cut back ({write_err.strerror or write_err})"
    again = "there is space" if full else "the directory is writable"
    kept = (
        f"the last good checkpoint is step {last} (continue from it with --resume once {again})"
        if steps
        else "no checkpoint was saved before"
    )
    return TrainingError(f"{what}; stopping. Nothing was deleted: {kept}; {metrics}.")


def check_event_file(tensorboard, checkpointer, metrics_path) -> None:
    """The run's one-line error for an event-file write of `tensorboard` (a TensorBoardLog, or
    None) that failed quietly (a flush on the way out), as for any other write of the run."""
    failure = tensorboard.failure if tensorboard is not None else None
    if failure is not None:
        raise (
            write_failed(failure, checkpointer, metrics_path) if is_disk_full(failure) else failure
        )
