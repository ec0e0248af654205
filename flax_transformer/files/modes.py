"""File modes: a file written by a library that ignores the umask gets the mode `open()` would
have given it.

safetensors 0.8 writes through a temporary file created with mode 0600 and renames it, whatever
the umask; such a weight file would then be unreadable to another user or a container, unlike
every other file of a run. `give_umask_mode(path)` after the write puts that right.
"""

from __future__ import annotations

import os
from pathlib import Path

NEW_FILE_MODE = 0o666  # what open() asks for; the umask takes bits away


def current_umask() -> int:
    """This process's umask, read without changing it where Linux says it (/proc), else by the
    classic set-and-restore."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode() -> int:
    """The permission bits a new file gets from open() under the current umask (e.g. 0o644)."""
    return NEW_FILE_MODE & ~current_umask()


def give_umask_mode(path: str | Path) -> None:
    """chmod `path` to the mode a file written with open() would have (see module doc)."""
    os.chmod(path, umask_mode())
