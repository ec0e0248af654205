"""Out of room while writing: a full disk, a full quota, or the file-size limit (`ulimit -f`).

Every command that writes reports these in one line naming the path (exit 1), not with a
traceback. The errors are recognised also when a library (Orbax, tensorstore) has wrapped the
OSError into its own error and only its text says so, or when the project has re-raised it as
its own error (`raise ... from None` keeps the original as `__context__`).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
OUT_OF_SPACE_TEXTS = ("no space left on device", "disk quota exceeded", "file too large")


def _chain(err: BaseException, depth: int = 4) -> Iterator[BaseException]:
    """`err` and the errors it was raised from or during (a few levels)."""
    seen = 0
    while err is not None and seen < depth:
        yield err
        err, seen = err.__cause__ or err.__context__, seen + 1


def out_of_space_errno(err: BaseException) -> int | None:
    """ENOSPC, EDQUOT or EFBIG for an out-of-space error anywhere in `err`'s chain, else None."""
    for link in _chain(err):
        code, text = getattr(link, "errno", None), str(link).lower()
        if code in OUT_OF_SPACE_ERRNOS:
            return code
        if "file too large" in text:
            return errno.EFBIG
        if "disk quota exceeded" in text:
            return errno.EDQUOT
        if "no space left on device" in text:
            return errno.ENOSPC
    # An error that only says it was out of space (a CheckpointWriteError's disk_full).
    return errno.ENOSPC if any(getattr(e, "disk_full", False) for e in _chain(err)) else None


def is_out_of_space(err: BaseException) -> bool:
    """A full disk / quota / file-size limit, said by `err` or an error in its chain."""
    return out_of_space_errno(err) is not None


def out_of_space_message(err: BaseException, path=None) -> str:
    """One line for `err` (is_out_of_space): what ran out, and the path being written (the
    error's filename, else `path`)."""
    name = getattr(err, "filename", None) or path or "a file"
    kind = out_of_space_errno(err)
    if kind == errno.EFBIG:
        return f"the file-size limit (ulimit -f) stopped the write of {name}"
    if kind == errno.EDQUOT:
        return f"the disk quota is full: cannot write {name}"
    return f"the disk is full: cannot write {name}"
