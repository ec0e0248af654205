"""Building and loading the package's C++ kernels (nn/int8_amx.cc, nn/f32_packed.cc), which run
inside jitted code as XLA FFI custom calls.

A kernel is compiled from source the first time a process needs it (g++, a few seconds), into
a cache keyed by its sources, the compiler flags and jax's version ($FLAX_TRANSFORMER_CACHE,
else $XDG_CACHE_HOME/flax_transformer, else ~/.cache/flax_transformer), loaded with ctypes, and
its handlers registered with jax.ffi. Every failure is a reason (a string), never a crash: the
caller then runs XLA's own product.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

HERE = Path(__file__).parent
HEADERS = (HERE / "native_pool.h",)  # included by every kernel: part of each one's key


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        return set(_proc_flags())
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


@functools.cache
def _proc_flags() -> frozenset[str]:
    """This machine's flags, read once (a kernel's choice is asked at every product traced)."""
    try:
        return frozenset(cpu_flags(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return frozenset()


def switch_value(name: str, choices: tuple[str, ...]) -> str:
    """The environment switch `name` (default "auto"); ValueError naming it for anything else."""
    value = os.environ.get(name, "auto").strip().lower() or "auto"
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def unsupported_platform() -> str | None:
    """None on Linux x86-64 (where the kernels are built) with JAX computing on the CPU, else
    why not (a jitted program on a GPU cannot call a CPU kernel)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the kernels need Linux on x86-64, this is {platform.system()} {platform.machine()}"
    if jax.default_backend() != "cpu":
        return f"the kernels run on the CPU, JAX computes on {jax.default_backend()} here"
    return None


def cache_dir() -> Path:
    """Where built kernels are kept: $FLAX_TRANSFORMER_CACHE, else $XDG_CACHE_HOME or ~/.cache,
    /flax_transformer."""
    if os.environ.get("FLAX_TRANSFORMER_CACHE"):
        return Path(os.environ["FLAX_TRANSFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flax_transformer"


def build_and_register(
    source: Path, flags: tuple[str, ...], targets: dict[str, str]
) -> tuple[ctypes.CDLL | None, str | None]:
    """(the library, None) with each `targets` handler (FFI target name -> exported symbol)
    registered for the CPU, or (None, why not)."""
    try:
        return _build_and_register(source, flags, targets)
    except OSError as err:  # an unwritable cache, a library that will not load
        return None, f"{source.name} could not be built or loaded: {err}"


def _build_and_register(source, flags, targets):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None, f"no C++ compiler (g++) to build {source.name}"
    include = Path(jax.ffi.include_dir())
    text = source.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    key = hashlib.sha256(text + " ".join(flags).encode() + jax.__version__.encode())
    library = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        # Built beside its final name, then renamed: processes building at once never load a
        # half-written file.
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            built = Path(tmp) / library.name
            command = [compiler, *flags, f"-I{include}", f"-I{HERE}", str(source), "-o", str(built)]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                return None, f"building {source.name} with {compiler} failed: {last}"
            os.replace(built, library)
    lib = ctypes.cdll.LoadLibrary(str(library))
    for target, symbol in targets.items():
        with contextlib.suppress(ValueError):  # registered already (a second import path)
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), "cpu")
    return lib, None
