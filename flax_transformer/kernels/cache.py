"""Where built kernel libraries live, and whether an entry can be trusted. No JAX, no compiler.

A library is kept as `<cache>/kernels/<name>-<key>.so` with a manifest `<name>-<key>.json`
beside it, both written by `ftx kernels build` (kernels.build) and only read here. The key is a
hash of the source, the header it includes, the compiler flags and the versions of jax and
jaxlib (whose FFI headers it is compiled against): a changed .cc, other flags or another jax
is another entry, never the old library. The manifest records the library's size and SHA-256;
an entry whose file disagrees (cut short by a full disk, a copy, an editor) is reported and
skipped, never loaded: loading a truncated shared library can kill the process with SIGBUS.

The cache: $FLAX_TRANSFORMER_CACHE, else $XDG_CACHE_HOME/flax_transformer, else
~/.cache/flax_transformer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from flax_transformer.kernels.libraries import HEADERS, HERE, Library

FORMAT = 1  # the manifest's layout; part of the key
BUILD_COMMAND = "`ftx kernels build`"


def cache_dir() -> Path:
    """$FLAX_TRANSFORMER_CACHE, else $XDG_CACHE_HOME or ~/.cache, /flax_transformer."""
    if os.environ.get("FLAX_TRANSFORMER_CACHE"):
        return Path(os.environ["FLAX_TRANSFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flax_transformer"


def kernel_dir() -> Path:
    """The directory of the built libraries: <cache>/kernels."""
    return cache_dir() / "kernels"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    return (("jax", _version("jax")), ("jaxlib", _version("jaxlib")))


def toolchain_versions() -> dict[str, str]:
    """The versions a library is built against (part of its key): jax and jaxlib."""
    return dict(_versions())


def key(lib: Library) -> str:
    """16 hex digits of SHA-256 over the source, the headers, the flags and the versions."""
    files = tuple(HERE / name for name in (lib.source, *HEADERS))
    stats = tuple((f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    versions = json.dumps(toolchain_versions(), sort_keys=True)
    return _key(files, stats, lib.flags, versions)


@functools.cache  # keyed by the files' mtimes and sizes too: an edited source is hashed again
def _key(files: tuple[Path, ...], stats: tuple, flags: tuple[str, ...], versions: str) -> str:
    digest = hashlib.sha256(f"format {FORMAT}\n".encode())
    for path in files:
        digest.update(path.read_bytes())
    digest.update("\0".join(flags).encode())
    digest.update(versions.encode())
    return digest.hexdigest()[:16]


def library_path(lib: Library) -> Path:
    """Where `lib`'s library is (or would be) for the current sources, flags and jax."""
    return kernel_dir() / f"{lib.name}-{key(lib)}.so"


def manifest_path(library: Path) -> Path:
    """The manifest beside a library: the same name, .json."""
    return library.with_suffix(".json")


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Entry:
    """What the cache holds for a library: `state` "ok" (then `path` may be loaded), "missing"
    (not built for these sources and this jax) or "damaged" (`problem` says how)."""

    path: Path
    state: str
    problem: str | None = None


def check(lib: Library) -> Entry:
    """The cache entry of `lib`, its size and checksum compared with its manifest."""
    path = library_path(lib)
    manifest = manifest_path(path)
    try:
        if not path.exists():
            stale = sorted(p.name for p in kernel_dir().glob(f"{lib.name}-*.so") if p != path)
            why = f"{lib.name} is not built"
            if stale:
                why += " for these sources and this jax (the cache holds only a stale build)"
            return Entry(path, "missing", f"{why}; {BUILD_COMMAND} builds it")
        why = _damage(path, manifest)
    except OSError as err:
        why = f"cannot read the kernel library {path}: {err}"
    if why is None:
        return Entry(path, "ok")
    return Entry(path, "damaged", f"{why}: skipped, never loaded; {BUILD_COMMAND} rebuilds it")


def _damage(path: Path, manifest: Path) -> str | None:
    """None when the library's size and checksum are its manifest's, else what is wrong."""
    if not manifest.exists():
        return f"the kernel library {path} has no manifest ({manifest.name})"
    try:
        recorded = json.loads(manifest.read_text())
        size, sha256 = int(recorded["size"]), str(recorded["sha256"])
    except (ValueError, KeyError, TypeError) as err:
        return f"the manifest {manifest} of a kernel library is damaged ({err!r})"
    actual = path.stat().st_size
    if actual != size:
        return f"the kernel library {path} is damaged ({actual} bytes, {size} when built)"
    if file_digest(path) != sha256:
        return f"the kernel library {path} is damaged (its checksum is not the one built)"
    return None


def manifest_record(lib: Library, library: Path, compiler: str, version: str) -> dict:
    """What `ftx kernels build` writes beside a library it built."""
    return {
        "format": FORMAT,
        "library": lib.name,
        "source": lib.source,
        "flags": list(lib.flags),
        "compiler": compiler,
        "compiler_version": version,
        **toolchain_versions(),
        "size": library.stat().st_size,
        "sha256": file_digest(library),
    }
