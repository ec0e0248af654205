"""int8 products on Intel AMX with the weights packed once: the fast path of nn.int8_products.

XLA:CPU's own int8 dot (YNNPACK) packs its weight operand into the tile layout inside every
call: in a batch-8 beam-4 decode that packing took twice the time of the products themselves
(bench/NOTES.md, "What is left of #28's decode targets"). `int8_amx.cc` is a small kernel
that reads weights packed at load time (`pack`), called from jitted code as an XLA FFI custom
call (`product`): int8 x int8 -> int32, exact, so it returns what the XLA dot returns.

The kernel is compiled from source the first time a process needs it (g++, a few seconds),
into a cache keyed by the source, the compiler flags and jaxlib's version
($FLAX_TRANSFORMER_CACHE, else $XDG_CACHE_HOME/flax_transformer, else ~/.cache/flax_transformer),
then loaded with ctypes and registered with jax.ffi.

Which path runs (`reason_unavailable`, read when a model is quantised): the environment variable
FLAX_TRANSFORMER_INT8_KERNEL = `auto` (the default: AMX where it works, XLA's dot elsewhere),
`xla` (always XLA's dot) or `amx` (AMX, an error saying why where it cannot run). AMX needs
Linux on x86-64, a CPU with amx_tile and amx_int8 (Intel Xeon since Sapphire Rapids), the
kernel's permission for the process, and a C++ compiler.
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
import jax.numpy as jnp
import numpy as np

SWITCH = "FLAX_TRANSFORMER_INT8_KERNEL"
CHOICES = ("auto", "xla", "amx")
SOURCE = Path(__file__).with_name("int8_amx.cc")
FLAGS = ("-O3", "-std=c++17", "-mamx-tile", "-mamx-int8", "-fPIC", "-shared", "-w")
TARGET = "flax_transformer_int8_amx_product"
K_MULTIPLE, N_MULTIPLE = 64, 32  # the kernel's tile sizes: K in 64-byte steps, N in 32 columns


def choice() -> str:
    """The switch's value; ValueError naming the variable for anything else."""
    value = os.environ.get(SWITCH, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{SWITCH}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def reason_unavailable() -> str | None:
    """None when the AMX kernel will run here, else one line saying why not. Builds and loads
    the kernel on the first call that gets that far (cached)."""
    if choice() == "xla":
        return f"{SWITCH}=xla"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"AMX needs Linux on x86-64, this is {platform.system()} {platform.machine()}"
    missing = {"amx_tile", "amx_int8"} - cpu_flags()
    if missing:
        return f"this CPU lacks {' and '.join(sorted(missing))}"
    return _load()[1]


def use_amx() -> bool:
    """Whether int8 products should run on AMX: per the switch, and where the kernel runs;
    ValueError when the switch says `amx` and it cannot."""
    why = reason_unavailable()
    if why is not None and choice() == "amx":
        raise ValueError(f"{SWITCH}=amx, but the AMX int8 kernel cannot run here: {why}")
    return why is None


def supports(k: int) -> bool:
    """Whether a product with k input features fits the kernel's tiles."""
    return k % K_MULTIPLE == 0


def cache_dir() -> Path:
    """Where built kernels are kept: $FLAX_TRANSFORMER_CACHE, else $XDG_CACHE_HOME or ~/.cache,
    /flax_transformer."""
    if os.environ.get("FLAX_TRANSFORMER_CACHE"):
        return Path(os.environ["FLAX_TRANSFORMER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flax_transformer"


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded, registered library, None) or (None, why not)."""
    try:
        return _build_and_register()
    except OSError as err:  # an unwritable cache, a library that will not load
        return None, f"the AMX kernel could not be built or loaded: {err}"


def _build_and_register() -> tuple[ctypes.CDLL | None, str | None]:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return None, "no C++ compiler (g++) to build the kernel"
    include = Path(jax.ffi.include_dir())
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(FLAGS).encode() + jax.__version__.encode()
    ).hexdigest()[:16]
    library = cache_dir() / f"int8_amx-{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        # Built beside its final name, then renamed: processes building at once never load a
        # half-written file.
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            built = Path(tmp) / library.name
            command = [compiler, *FLAGS, f"-I{include}", str(SOURCE), "-o", str(built)]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                return None, f"building {SOURCE.name} with {compiler} failed: {last}"
            os.replace(built, library)
    lib = ctypes.cdll.LoadLibrary(str(library))
    if lib.int8_amx_request_permission() != 0:
        return None, "the operating system refused this process the AMX tile state"
    with contextlib.suppress(ValueError):  # registered already (a second import path)
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.int8_amx_product), "cpu")
    return lib, None


def pack(values: np.ndarray) -> np.ndarray:
    """int8 weights (K, N) -> (N' / 16, K / 4, 16, 4), the layout the kernel reads, N padded
    with zero columns to N' (a multiple of 32); packed[b, q, j, i] = values[4q + i, 16b + j]."""
    k, n = values.shape
    if not supports(k):
        raise ValueError(f"int8_amx.pack: K = {k} is not a multiple of {K_MULTIPLE}")
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.int8)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k // 4, 4, -1, 16).transpose(2, 0, 3, 1))


def product(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x int8 (M, K) times the packed (K, n) weights -> int32 (M, n), exact."""
    columns = packed.shape[0] * 16
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], columns), jnp.int32))
    out = call(x, packed)
    return out if columns == n else out[:, :n]
