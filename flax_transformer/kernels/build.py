"""Compiling the kernel libraries: run by `ftx kernels build` (cli/kernels.py, and
scripts/setup.sh after the install), never inside a library call.

Each library (kernels.libraries) is compiled with the C++ compiler ($CXX, else g++ or c++ on
PATH) against jax's FFI headers into a temporary directory inside the cache, its size and
SHA-256 written to a manifest beside it, then both renamed into place (kernels.cache): a
process reading the cache meanwhile sees the old entry or none, never a half-written file.
Every failure (no compiler, a compile error, an unwritable cache) is a result with one line
saying why, never an exception: the library calls then run XLA's own operations.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flax_transformer.kernels import cache, cpu
from flax_transformer.kernels.libraries import HERE, LIBRARIES, Library


@dataclass(frozen=True)
class BuildResult:
    """`state`: "built", "present" (an intact entry was there), "skipped" (this machine cannot
    run it: `why`) or "failed" (`why`)."""

    name: str
    state: str
    path: Path | None = None
    why: str | None = None
    seconds: float = 0.0


def compiler() -> tuple[str | None, str | None]:
    """(the compiler's path, None) or (None, why there is none)."""
    named = os.environ.get("CXX")
    if named:
        found = shutil.which(named)
        if found is None:
            return None, f"CXX={named} is not a compiler that can be run"
        return found, None
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        return None, "no C++ compiler (g++ or c++ on PATH, or CXX)"
    return found, None


def _compiler_version(path: str) -> str:
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (result.stdout.strip().splitlines() or ["unknown"])[0]


def runnable_here(lib: Library) -> str | None:
    """None when this machine can run `lib`, else why not (the platform, the CPU's flags)."""
    return cpu.platform_problem() or cpu.missing_flags(lib.cpu)


def build(lib: Library, *, force: bool = False) -> BuildResult:
    """Build `lib` into the cache unless an intact entry is there (`force`: build anyway)."""
    entry = cache.check(lib)
    if entry.state == "ok" and not force:
        return BuildResult(lib.name, "present", entry.path)
    compiler_path, why = compiler()
    if compiler_path is None:
        return BuildResult(lib.name, "failed", why=why)
    start = time.perf_counter()
    try:
        entry.path.parent.mkdir(parents=True, exist_ok=True)
        with _one_builder(entry.path.parent):
            if not force and cache.check(lib).state == "ok":  # built meanwhile by another
                return BuildResult(lib.name, "present", entry.path)
            return _build_in(entry.path, lib, compiler_path, start)
    except OSError as err:
        where = err.filename or entry.path.parent
        return BuildResult(
            lib.name, "failed", why=f"cannot write the kernel cache {where}: {err.strerror or err}"
        )


@contextlib.contextmanager
def _one_builder(directory: Path):
    """Within: no other `ftx kernels build` writes in `directory` (a lock file, Linux flock);
    two builds of one library would otherwise pair one's library with the other's manifest."""
    with open(directory / ".build.lock", "w") as lock:
        try:
            import fcntl
        except ImportError:  # not Linux: the kernels do not run there anyway
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_in(path: Path, lib: Library, compiler_path: str, start: float) -> BuildResult:
    """Compile into a temporary directory beside `path`, write the manifest, rename both."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        built = Path(tmp) / path.name
        why = _compile(compiler_path, lib, built)
        if why is not None:
            return BuildResult(lib.name, "failed", why=why)
        record = cache.manifest_record(lib, built, compiler_path, _compiler_version(compiler_path))
        manifest = cache.manifest_path(built)
        manifest.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(built, path)
        os.replace(manifest, cache.manifest_path(path))
    return BuildResult(lib.name, "built", path, seconds=time.perf_counter() - start)


def _compile(compiler_path: str, lib: Library, out: Path) -> str | None:
    import jax  # its FFI headers (the command loads jax; library calls never get here)

    include = Path(jax.ffi.include_dir())
    command = [compiler_path, *lib.flags, f"-I{include}", f"-I{HERE}", str(lib.source_path)]
    try:
        result = subprocess.run([*command, "-o", str(out)], capture_output=True, text=True)
    except OSError as err:
        return f"cannot run {compiler_path}: {err.strerror or err}"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"building {lib.source} with {compiler_path} failed: {last}"
    if not out.exists():
        return f"{compiler_path} wrote no library for {lib.source}"
    return None


def build_all(*, every: bool = False, force: bool = False) -> list[BuildResult]:
    """Build every library this machine can run (`every`: all of them, e.g. for a cache shared
    with other machines), each on its own; the others are "skipped" with the reason."""
    results = []
    for lib in LIBRARIES.values():
        why = None if every else runnable_here(lib)
        if why is not None:
            results.append(BuildResult(lib.name, "skipped", why=why))
            continue
        results.append(build(lib, force=force))
    return results
