"""What a damaged checkpoint lost, in words: a file list written when a save is complete, and a
check of a step directory against it.

Orbax's own errors for a damaged checkpoint name a low-level symptom (a deleted data file reads
as a "truncated Zstd-compressed stream"); the list says which file is gone or changed size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flax_transformer.files.atomic_io import atomic_write_text

FILE_LIST = "files.json"  # inside each finished step directory: {relative path: size in bytes}


def record_files(step_dir: Path) -> None:
    """Write the file list of a finished step directory (once; in a multi-process run only
    process 0 calls it, see Checkpointer.wait)."""
    target = step_dir / FILE_LIST
    if target.exists() or not step_dir.is_dir():
        return
    sizes = {}
    for root, _, names in os.walk(step_dir):
        for name in names:
            path = Path(root) / name
            try:
                sizes[str(path.relative_to(step_dir))] = path.stat().st_size
            except FileNotFoundError:  # a temporary file renamed meanwhile: not part of the step
                continue
    atomic_write_text(target, json.dumps(sizes, sort_keys=True))


def damage(step_dir: Path) -> str | None:
    """'file params/d/0a1b is missing (deleted?)' etc. when the directory differs from its file
    list; None when it matches or has no list."""
    if not step_dir.is_dir():
        return f"the directory {step_dir} is missing"
    try:
        sizes = json.loads((step_dir / FILE_LIST).read_text())
    except (OSError, ValueError):
        return None
    problems = []
    for name, size in sorted(sizes.items()):
        path = step_dir / name
        if not path.exists():
            problems.append(f"file {name} is missing (deleted?)")
        elif path.stat().st_size != size:
            problems.append(
                f"file {name} is {path.stat().st_size} bytes, {size} when saved (truncated or "
                "overwritten?)"
            )
    if not problems:
        return None
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def short_error(err: BaseException) -> str:
    """The first line of a (tensorstore / Orbax) error, without its multi-kilobyte spec."""
    text = str(err).split("\n", 1)[0].split(" [tensorstore_spec=", 1)[0]
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."
