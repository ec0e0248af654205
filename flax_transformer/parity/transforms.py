"""Declared layout transforms: bring a torch tensor into the layout its Flax twin has.

Layouts are declared per pair, never guessed: `compare_modules(..., transforms={regex: t})`
applies `t` to every torch tensor whose name (`module`, `module:key`) fully matches `regex`,
before pairing and comparing. A transform is any callable ndarray -> ndarray; these are the
common ones, with a readable name for the report:

    seq_first_to_batch_first()   (L, N, ...) -> (N, L, ...)
    transpose(0, 2, 1, 3)        any axis permutation
    split_heads(4)               (N, L, H*D) -> (N, L, H, D)
    merge_heads()                (N, L, H, D) -> (N, L, H*D)
    heads_first(4)               (N, L, H*D) -> (N, H, L, D)
    chain(a, b)                  a then b

`flax_transforms={regex: t}` does the same to Flax tensors (names `path`, `path:key`), and
there a transform may also read the module's first input:

    minus_input()                output - input: what a module added to its input (positions)
    times_in_own_dtype(c, "c")   x * c rounded to x's dtype (a scale applied after the module)
    take(0)                      x[0]: one row of a batch (all rows equal, e.g. a table)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class _Named:
    """A transform with the name the report shows; `needs_input`: fn(array, module_input)."""

    name: str
    fn: Callable
    needs_input: bool = False

    def __call__(self, array: np.ndarray, module_input: np.ndarray | None = None) -> np.ndarray:
        if not self.needs_input:
            return self.fn(array)
        if module_input is None or np.shape(module_input) != np.shape(array):
            raise ValueError(
                f"{self.name} needs the module's first input of the output's shape "
                f"{np.shape(array)}, got {None if module_input is None else np.shape(module_input)}"
            )
        return self.fn(array, module_input)

    def __str__(self) -> str:
        return self.name


def transpose(*axes: int) -> Transform:
    """np.transpose(x, axes); no axes: reverse them (a matrix transposed)."""
    return _Named(f"transpose{axes}", lambda x: np.transpose(x, axes or None))


def seq_first_to_batch_first() -> Transform:
    """(L, N, ...) -> (N, L, ...): torch's sequence-first default against batch-first Flax."""
    return _Named("seq_first_to_batch_first", lambda x: np.swapaxes(x, 0, 1))


def split_heads(num_heads: int) -> Transform:
    """(..., H*D) -> (..., H, D)."""

    def fn(x):
        if x.shape[-1] % num_heads:
            raise ValueError(f"last axis {x.shape[-1]} is not divisible by {num_heads} heads")
        return x.reshape(x.shape[:-1] + (num_heads, x.shape[-1] // num_heads))

    return _Named(f"split_heads({num_heads})", fn)


def merge_heads() -> Transform:
    """(..., H, D) -> (..., H*D)."""
    return _Named("merge_heads", lambda x: x.reshape(x.shape[:-2] + (-1,)))


def heads_first(num_heads: int) -> Transform:
    """(N, L, H*D) -> (N, H, L, D): per-head tensors as attention kernels lay them out."""
    split = split_heads(num_heads)
    return _Named(f"heads_first({num_heads})", lambda x: np.swapaxes(split(x), -3, -2))


def minus_input() -> Transform:
    """output - the module's first input (Flax side only): what the module added."""
    return _Named("minus_input", lambda x, module_input: x - module_input, needs_input=True)


def times_in_own_dtype(factor: float, name: str) -> Transform:
    """x * factor, the factor rounded to x's dtype first (as the model multiplies)."""
    return _Named(f"times {name}", lambda x: x * np.asarray(factor, np.asarray(x).dtype))


def take(index: int, axis: int = 0) -> Transform:
    """np.take(x, index, axis): e.g. row 0 of a batch whose rows are all the same table."""
    return _Named(f"take({index}, axis={axis})", lambda x: np.take(x, index, axis=axis))


def chain(*transforms: Transform) -> Transform:
    """Apply `transforms` left to right (the first may read the module's input)."""

    def fn(x, module_input=None):
        for i, t in enumerate(transforms):
            x = t(x, module_input) if i == 0 and getattr(t, "needs_input", False) else t(x)
        return x

    needs_input = bool(transforms) and getattr(transforms[0], "needs_input", False)
    return _Named(" then ".join(map(str, transforms)), fn, needs_input)


def transform_for(
    transforms: Mapping[str, Transform] | None, names: tuple[str, ...]
) -> Transform | None:
    """The first transform whose regex fully matches one of `names` (tensor, then module)."""
    for pattern, transform in (transforms or {}).items():
        if any(re.fullmatch(pattern, name) for name in names):
            return transform
    return None
