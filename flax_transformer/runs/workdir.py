"""The run directory of a training run before it trains: writable, not a second run on top of
another, locked by one process (runs/run_dir.py's lock) from its first write to the end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flax_transformer.runs import run_dir
from flax_transformer.runs.run_dir import read_run_json
from flax_transformer.runs.spec import UsageError


def prepare_workdir(workdir: Path, resume: bool) -> bool:
    """Writable, and never a second run on top of an existing one. Creates nothing: the
    workdir is made once all input has been read (make_workdir). True when a --resume finds
    no checkpoint (the run stopped before its first save): it starts over from step 0 with
    its saved settings, which is what resuming it means."""
    existing = workdir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problem = "Not a directory" if existing.exists() and not existing.is_dir() else "no access"
        raise UsageError(f"--workdir {workdir}: not writable ({problem}: {existing})")
    checkpoints = workdir / run_dir.CHECKPOINTS
    run_json = workdir / run_dir.RUN_JSON
    holds_run = workdir.is_dir() and has_run(workdir)
    if run_json.exists() and not holds_run and not resume:
        print(
            f"warning: {run_json} is not readable JSON and there is no checkpoint: a run that "
            "never started; this run replaces it",
            file=sys.stderr,
        )
    if holds_run and not resume:
        raise UsageError(
            f"--workdir {workdir} already holds a run; pass --resume to continue it, or choose "
            "another --workdir (nothing was overwritten)"
        )
    has_checkpoint = checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir())
    if resume and not has_checkpoint:
        print(
            f"--resume: no checkpoint in {checkpoints} (the run stopped before its first "
            "save): starting it over from step 0 with its settings"
        )
        return True
    return False


def has_run(workdir: Path) -> bool:
    """The workdir holds a run: a checkpoint or a readable run.json."""
    checkpoints = workdir / run_dir.CHECKPOINTS
    has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
    return has_checkpoints or read_run_json(workdir) is not None


class WorkdirLock:
    """The run directory's lock (run_dir.lock_run_dir), taken by process 0 at its first write
    (make_workdir) and held until the command ends; the other processes of a multi-process run
    take none (they pass no lock to make_workdir)."""

    def __init__(self, workdir: Path):
        self.workdir, self._held = workdir, None

    def take(self) -> bool:
        """Lock the workdir if it exists and is not locked yet; True if this call locked it.
        run_dir.RunDirInUse (exit status 2) when another run holds it."""
        if self._held is not None or not self.workdir.is_dir():
            return False
        self._held = run_dir.lock_run_dir(self.workdir)
        return True

    def release(self) -> None:
        """Unlock (the end of the command); nothing if this process holds no lock."""
        if self._held is not None:
            self._held.release()
            self._held = None


def make_workdir(workdir: Path, lock: WorkdirLock | None = None) -> bool:
    """Create the workdir (all input is read and checked by now), lock it (`lock`) and probe
    that it takes files; True if the lock was taken now (the directory was new)."""
    locked_now = False
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        locked_now = lock.take() if lock is not None else False
        probe = workdir / f".write_test_{os.getpid()}"  # one per process of a run
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UsageError(
            f"--workdir {workdir}: not writable ({err.strerror or err}: {err.filename or workdir})"
        ) from None
    return locked_now
