"""Staging directories that say who is building them, so that the next run can tell an
abandoned one from a live one.

A directory is written whole or not at all by building it in a hidden staging directory beside
its destination and renaming it into place (atomic_io.staged_directory, the token cache). An
error or a signal removes the stage; SIGKILL cannot, and left it forever (up to a full copy of
the data). Each stage therefore holds an OWNER file ("host pid"), and making a new stage with
the same prefix removes the stages whose owner process is gone, one line each.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

OWNER = ".owner"  # in a staging directory: "host pid" of the process building it
# A stage with no owner file (an older version's, or one a process is just creating) is
# abandoned only once it is this old.
UNOWNED_GRACE_S = 60


def make_stage(parent: Path, prefix: str) -> Path:
    """A fresh staging directory `parent/prefix*` owned by this process (mode as the umask
    gives, not mkdtemp's 0700), after removing the abandoned stages of the same prefix."""
    remove_abandoned_stages(parent, prefix)
    staged = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (staged / OWNER).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    umask = os.umask(0)
    os.umask(umask)
    staged.chmod(0o777 & ~umask)
    return staged


def release_stage(staged: Path) -> None:
    """Drop the owner file before the stage becomes its destination."""
    (Path(staged) / OWNER).unlink(missing_ok=True)


def remove_abandoned_stages(parent: Path, prefix: str) -> list[Path]:
    """Remove the stages `parent/prefix*` whose process is gone; say each in one line."""
    removed = []
    for staged in Path(parent).glob(prefix + "*"):
        if staged.is_dir() and is_abandoned(staged):
            shutil.rmtree(staged, ignore_errors=True)
            print(f"removed {staged}: left unfinished by a stopped run", file=sys.stderr)
            removed.append(staged)
    return removed


def is_abandoned(staged: Path) -> bool:
    """Its owner file names a process of this host that no longer exists, or it has none and
    is older than UNOWNED_GRACE_S. Another host's stage (a shared file system) is never
    judged."""
    try:
        host, pid = (staged / OWNER).read_text().split()
    except (OSError, ValueError):
        try:
            return time.time() - staged.stat().st_mtime > UNOWNED_GRACE_S
        except OSError:
            return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False
