"""Lazy re-exports: a package names what it offers; the module behind a name loads on first use.

So `import flax_transformer` (or one of its subpackages) stays cheap and loads no JAX until a
JAX-backed name is touched.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping


def lazy_exports(package: str, exports: Mapping[str, str]):
    """(__getattr__, __dir__) for a package: `exports` maps public name -> defining module."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        globals_of_package = importlib.import_module(package).__dict__
        globals_of_package[name] = value  # later lookups skip __getattr__
        return value

    def __dir__():
        return sorted(set(exports) | set(importlib.import_module(package).__dict__))

    return __getattr__, __dir__


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """The DeprecationWarning of a moved name: `old` still works this release; use `new`."""
    import warnings

    warnings.warn(
        f"{old} is deprecated: use {new} (the old path goes in the next release)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_names(module: str, names: Mapping[str, str]):
    """(__getattr__, __dir__) for a module whose names moved one by one: `names` maps each old
    name to "new.module:name"; each resolves from there with a DeprecationWarning."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, attr = names[name].split(":")
        warn_moved(f"{module}.{name}", f"{home}.{attr}")
        return getattr(importlib.import_module(home), attr)

    def __dir__():
        return sorted(names)

    return __getattr__, __dir__


def moved_module(old: str, new: str):
    """A module `__getattr__` for a module that moved: every name still resolves (from the new
    home) and warns once per use with a DeprecationWarning naming the new home. Old paths are kept
    this way for one release."""

    def __getattr__(name: str):
        if name.startswith("_"):  # private names were never promised (and tools probe them)
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warn_moved(f"{old}.{name}", f"{new}.{name}")
        return getattr(importlib.import_module(new), name)

    return __getattr__
