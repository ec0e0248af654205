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
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class _Named:
    """A transform with the name the report shows."""

    name: str
    fn: Transform

    def __call__(self, array: np.ndarray) -> np.ndarray:
        return self.fn(array)

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


def chain(*transforms: Transform) -> Transform:
    """Apply `transforms` left to right."""

    def fn(x):
        for t in transforms:
            x = t(x)
        return x

    return _Named(" then ".join(map(str, transforms)), fn)


def transform_for(
    transforms: Mapping[str, Transform] | None, names: tuple[str, ...]
) -> Transform | None:
    """The first transform whose regex fully matches one of `names` (tensor, then module)."""
    for pattern, transform in (transforms or {}).items():
        if any(re.fullmatch(pattern, name) for name in names):
            return transform
    return None
