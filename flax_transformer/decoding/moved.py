"""Old module names kept as thin shims: `moved(...)` gives a module a `__getattr__` that
re-exports each old name from its new home with a DeprecationWarning naming that home."""

from __future__ import annotations

import importlib
import warnings


def warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def moved(module: str, names: dict[str, str]):
    """(__getattr__, __dir__) for `module`; names: old name -> "new.module:name"."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, attr = names[name].split(":")
        warn_moved(f"{module}.{name}", f"{home}.{attr}")
        return getattr(importlib.import_module(home), attr)

    def __dir__():
        return sorted(names)

    return __getattr__, __dir__
