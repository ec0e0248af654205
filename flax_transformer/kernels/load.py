"""Loading a built kernel library into this process: the cache entry is checked first (size and
checksum against its manifest, kernels.cache), then loaded with ctypes and its handlers
registered with jax.ffi for the CPU. Nothing is compiled and nothing is written here: a library
that is not built, or damaged, is a reason (a string) and the caller runs XLA's own operation.
One line on stderr says so, once per process (`notice`); `ftx info` shows every kernel's state.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging

import jax

from flax_transformer.kernels import cache
from flax_transformer.kernels.libraries import LIBRARIES

LOG = logging.getLogger("flax_transformer.kernels")
_said: set[str] = set()
_loaded: dict[str, ctypes.CDLL] = {}  # library path -> the library, loaded and registered


def notice(kind: str, line: str) -> None:
    """`line` on stderr (a logging warning: one bare line where logging is not configured),
    once per process for each `kind` ("not built", or a damaged library's path)."""
    if kind not in _said:
        _said.add(kind)
        LOG.warning("flax_transformer: %s", line)


def quiet_notices() -> None:
    """No "not built" line in this process (a caller that shows every kernel: `ftx info`)."""
    _said.add("not built")


def load(name: str) -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library `name` with its handlers registered, None) or (None, why not)."""
    lib = LIBRARIES[name]
    path = str(cache.library_path(lib))  # per path: the cache can move ($FLAX_TRANSFORMER_CACHE)
    if path in _loaded:
        return _loaded[path], None
    entry = cache.check(lib)
    if entry.state == "damaged":
        notice(str(entry.path), entry.problem)
        return None, entry.problem
    if entry.state != "ok":
        return None, entry.problem
    try:
        library = ctypes.CDLL(str(entry.path))
        handlers = {target: getattr(library, symbol) for target, symbol in lib.symbols.items()}
        if lib.init is not None and getattr(library, lib.init)() != 0:
            return None, "the operating system refused this process the AMX tile state"
    except (OSError, AttributeError) as err:
        return None, f"the kernel library {entry.path} could not be loaded: {err}"
    for target, handler in handlers.items():
        with contextlib.suppress(ValueError):  # registered already (loaded from another cache)
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), "cpu")
    _loaded[path] = library
    return library, None
