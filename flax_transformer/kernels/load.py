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
# library path -> (state, the library or None, why not): "ok" (loaded and registered),
# "missing", "damaged" or "unloadable", found once per process (asked at every product traced)
_results: dict[str, tuple[str, ctypes.CDLL | None, str | None]] = {}


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
    _, library, why = _result(name)
    return library, why


def state(name: str) -> str:
    """ "ok", "missing", "damaged" or "unloadable": what `load(name)` found."""
    return _result(name)[0]


def _result(name: str) -> tuple[str, ctypes.CDLL | None, str | None]:
    lib = LIBRARIES[name]
    path = str(cache.library_path(lib))  # per path: the cache can move ($FLAX_TRANSFORMER_CACHE)
    if path not in _results:
        _results[path] = _load(lib)
    return _results[path]


def _load(lib) -> tuple[str, ctypes.CDLL | None, str | None]:
    entry = cache.check(lib)
    if entry.state == "damaged":
        notice(str(entry.path), entry.problem)
    if entry.state != "ok":
        return entry.state, None, entry.problem
    try:
        library = ctypes.CDLL(str(entry.path))
        handlers = {target: getattr(library, symbol) for target, symbol in lib.symbols.items()}
        if lib.init is not None and getattr(library, lib.init)() != 0:
            why = "the operating system refused this process the AMX tile state"
            return "unloadable", None, why
    except (OSError, AttributeError) as err:
        return "unloadable", None, f"the kernel library {entry.path} could not be loaded: {err}"
    for target, handler in handlers.items():
        with contextlib.suppress(ValueError):  # registered already (loaded from another cache)
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), "cpu")
    return "ok", library, None
