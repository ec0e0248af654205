"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

Every output file of the project is written through here: the content goes to a temporary file
in the same directory, is flushed to disk, and then replaces the target with `os.replace` (atomic
on POSIX and Windows within one filesystem). A failed write removes its temporary file and leaves
the target as it was.

    atomic_write_text(path, text)
    with atomic_path(path) as tmp:      # for writers that want a file name (safetensors, PNG)
        save_file(tensors, tmp)

Outputs are checked before anything is read or written: check_output_path (a file) and
check_output_dir (a directory) refuse an output that is, contains or lies inside an input
(check_not_input), and a non-empty output directory unless --force; staged_directory writes a
directory whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from flax_transformer.files.space import out_of_space_errno
from flax_transformer.files.stages import make_stage, release_stage


class OutputPathError(ValueError):
    """An output path that cannot be written (its directory is missing, or it is an input)."""


# One rule for every command that writes: an output must not be, contain, or lie inside any of
# the command's inputs (writing, or --force replacing, it would destroy or change the input).
Inputs = Iterable["str | Path | tuple[str, str | Path] | None"]


def _labelled(inputs: Inputs) -> Iterator[tuple[str, Path]]:
    for item in inputs:
        if item is None:
            continue
        label, path = item if isinstance(item, tuple) else ("input", item)
        if path is not None:
            yield label, Path(path)


def _same(a: Path, b: Path) -> bool:
    """One file or directory: the same resolved path, or (hard links, case-insensitive file
    systems) the same inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _inside(inner: Path, outer: Path) -> bool:
    """Whether `inner` lies strictly inside the directory `outer` (symlinks and `..` resolved)."""
    inner, outer = inner.resolve(), outer.resolve()
    if outer in inner.parents:
        return True
    # `outer` may be reached under another name (a bind mount, a case-insensitive file system):
    # compare each existing ancestor of `inner` with it by inode too.
    return outer.exists() and any(_same(parent, outer) for parent in inner.parents)


def check_not_input(output: str | Path, inputs: Inputs, *, what: str = "output") -> None:
    """Raise OutputPathError, naming both paths, if `output` is, contains, or lies inside one of
    `inputs` (paths, or (label, path) pairs such as ("run directory", run); None is skipped).
    Call it before anything is read or written; it holds whatever --force says."""
    output = Path(output)
    for label, source in _labelled(inputs):
        if _same(output, source):
            relation = "is"
        elif _inside(source, output):
            relation = "contains"
        elif _inside(output, source):
            relation = "lies inside"
        else:
            continue
        raise OutputPathError(
            f"{what} {output} {relation} the {label} {source}; writing there would destroy or "
            "change the input (choose an output outside the inputs)"
        )


def check_output_path(path: str | Path, *, inputs: Inputs = (), what="output"):
    """Raise OutputPathError if `path`'s directory does not exist or is not a directory, if the
    path is a directory, or if it is, contains or lies inside one of `inputs` (check_not_input)."""
    path = Path(path)
    check_not_input(path, inputs, what=what)
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise OutputPathError(f"{what} {path}: the directory {parent} {problem}")
    if path.is_dir():
        raise OutputPathError(f"{what} {path} is a directory; give a file name")


def check_output_dir(
    path: str | Path, *, inputs: Inputs = (), force: bool = False, what="output"
) -> None:
    """Raise OutputPathError for an output directory that is, contains or lies inside one of
    `inputs` (even with `force`: --force never deletes an input), that exists as a file, or
    that is not empty while `force` is off."""
    path = Path(path)
    check_not_input(path, inputs, what=what)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{what} {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise OutputPathError(f"{what} {path} exists and is not empty (--force replaces it)")


@contextlib.contextmanager
def staged_directory(out: str | Path, force: bool = False, what="output") -> Iterator[Path]:
    """Yields a fresh temporary directory beside `out`; on success it becomes `out` (an old
    non-empty `out` is replaced only then, and only with force), on any error it is deleted.
    Check the output against the inputs first (check_output_dir)."""
    out = Path(out)
    check_output_dir(out, force=force, what=what)
    out.parent.mkdir(parents=True, exist_ok=True)
    # (a stage of an earlier command killed with SIGKILL is removed here, saying so)
    staging = make_stage(out.parent, f".{out.name}.partial-")
    try:
        yield staging
    except BaseException:
        remove_tree(staging)
        raise
    release_stage(staging)
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)


def remove_tree(path: Path, settle: float = 0.1, attempts: int = 30) -> None:
    """Delete `path` and make sure it stays deleted: after a failed Orbax save, tensorstore
    threads of the same save may still be writing (and re-creating directories) while the tree
    is removed, which left a half-written staging directory behind under load. Removes again
    until the path has stayed absent for `settle` seconds (at most `attempts` times)."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(settle)
        if not os.path.lexists(path):
            return


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
    except Exception as err:
        # Out of space, from a writer that names no file (safetensors): say which output.
        if getattr(err, "filename", None) is None and (code := out_of_space_errno(err)):
            raise OSError(code, os.strerror(code), str(path)) from err
        raise
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


def atomic_write_files(directory: str | Path, files: Mapping[str, bytes]) -> None:
    """Write each of `files` (a name in `directory` -> its bytes) atomically, in their order: a
    record of several files whose last one (e.g. a run.json) says the others are there."""
    for name, data in files.items():
        atomic_write_bytes(Path(directory) / name, data)
