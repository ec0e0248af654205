"""The one strict tree check: every missing, unexpected and mis-shaped entry in one error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ConversionError(ValueError):
    """Raised with every problem found, not just the first."""


def check_tree(
    found: Mapping[Any, tuple[int, ...]],
    expected: Mapping[Any, tuple[int, ...]],
    where: str,
    *,
    what: str = "key",
    name=str,
) -> None:
    """Raise one ConversionError listing every difference between two {name: shape} maps.

    `name` turns a key into what the message shows (e.g. a Flax path tuple into 'a/b/kernel').
    """
    problems = []
    for key, shape in expected.items():
        shape = tuple(shape)
        if key not in found:
            problems.append(f"missing {what} {name(key)!r} (expected shape {shape})")
        elif tuple(found[key]) != shape:
            problems.append(
                f"shape mismatch for {name(key)!r}: expected {shape}, found {tuple(found[key])}"
            )
    for key in set(found) - set(expected):
        problems.append(f"unexpected {what} {name(key)!r} (shape {tuple(found[key])})")
    if problems:
        raise ConversionError(
            f"{where}: {len(problems)} problem(s):\n  " + "\n  ".join(sorted(problems))
        )
