"""Out of room while writing: a full disk, a full quota, or the file-size limit (`ulimit -f`).

Every command that writes reports these in one line naming the path (exit 1), not with a
traceback; is_out_of_space recognises them also when a library (Orbax, tensorstore) has wrapped
the OSError into its own error and only its text says so.
"""

from __future__ import annotations

import errno

OUT_OF_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
OUT_OF_SPACE_TEXTS = ("no space left on device", "disk quota exceeded", "file too large")


def is_out_of_space(err: BaseException) -> bool:
    """An OSError for a full disk / quota / file-size limit, or an error whose text says so."""
    if isinstance(err, OSError) and err.errno in OUT_OF_SPACE_ERRNOS:
        return True
    text = str(err).lower()
    return any(marker in text for marker in OUT_OF_SPACE_TEXTS)


def out_of_space_message(err: BaseException, path=None) -> str:
    """One line for `err` (is_out_of_space): what ran out, and the path being written (the
    error's filename, else `path`)."""
    name = getattr(err, "filename", None) or path or "a file"
    code, text = getattr(err, "errno", None), str(err).lower()
    if code == errno.EFBIG or "file too large" in text:
        return f"the file-size limit (ulimit -f) stopped the write of {name}"
    if code == errno.EDQUOT or "quota" in text:
        return f"the disk quota is full: cannot write {name}"
    return f"the disk is full: cannot write {name}"
