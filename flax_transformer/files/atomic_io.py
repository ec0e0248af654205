"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

Every output file of the project is written through here: the content goes to a temporary file
in the same directory, is flushed to disk, and then replaces the target with `os.replace` (atomic
on POSIX and Windows within one filesystem). A failed write removes its temporary file and leaves
the target as it was.

    atomic_write_text(path, text)
    with atomic_path(path) as tmp:      # for writers that want a file name (safetensors, PNG)
        save_file(tensors, tmp)
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


class OutputPathError(ValueError):
    """An output path that cannot be written (its directory is missing, or it is an input)."""


def check_output_path(path: str | Path, *, inputs: tuple[str | Path, ...] = (), what="output"):
    """Raise OutputPathError if `path`'s directory does not exist or is not a directory, if the
    path is a directory, or if it resolves to one of `inputs` (writing would destroy it)."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise OutputPathError(f"{what} {path}: the directory {parent} {problem}")
    if path.is_dir():
        raise OutputPathError(f"{what} {path} is a directory; give a file name")
    for source in inputs:
        source = Path(source)
        same = path.resolve() == source.resolve() or (
            path.exists() and source.exists() and os.path.samefile(path, source)
        )
        if same:
            raise OutputPathError(
                f"{what} {path} is the input {source}; writing it would destroy the input "
                "(choose another output path)"
            )


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, so writers that go by it still work); on
    a clean exit it replaces `path`, on an error it is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb+") as handle:  # on disk before the rename makes it visible
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see atomic_path): readers see the old or the new file."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically, encoded with `encoding` (default UTF-8)."""
    atomic_write_bytes(path, text.encode(encoding))
