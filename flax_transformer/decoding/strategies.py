"""Decoding strategies, how the next token is chosen: `Greedy()`, `Sample(...)`, `Beam(...)`.

A strategy is a small frozen dataclass, checked when it is built, and a JAX pytree: its numbers
(temperature, top_k, top_p, alpha) are traced leaves, so decoding with another value does not
recompile; its class and `Beam.size` (an array dimension) are static.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


def _pytree(*numbers: str, static: tuple[str, ...] = ()):
    """Register a frozen dataclass as a pytree: `numbers` are leaves, `static` fields aux data."""

    def register(cls):
        def flatten(strategy):
            leaves = tuple(getattr(strategy, name) for name in numbers)
            return leaves, tuple(getattr(strategy, name) for name in static)

        def unflatten(aux, leaves):
            # Bypass __init__/__post_init__: under jit the leaves are tracers, not checkable.
            strategy = object.__new__(cls)
            for name, value in zip(numbers + static, tuple(leaves) + tuple(aux), strict=True):
                object.__setattr__(strategy, name, value)
            return strategy

        jax.tree_util.register_pytree_node(cls, flatten, unflatten)
        return cls

    return register


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@_pytree()
@dataclasses.dataclass(frozen=True)
class Greedy:
    """The most likely token at every step."""


@_pytree("temperature", "top_k", "top_p")
@dataclasses.dataclass(frozen=True)
class Sample:
    """A token drawn from softmax(logits / temperature), restricted to the `top_k` most likely
    tokens (0 = all) and then to the smallest set holding `top_p` of the probability mass
    (1 = all). temperature 0 is greedy. The same rng gives the same output."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative int (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", float(self.top_p))


@_pytree("alpha", static=("size",))
@dataclasses.dataclass(frozen=True)
class Beam:
    """Beam search with `size` beams; hypotheses are ranked by log-probability divided by
    GNMT's length penalty ((5 + length) / 6) ** alpha (alpha 0: plain log-probability)."""

    size: int
    alpha: float = 0.6

    def __post_init__(self):
        if not _is_int(self.size) or self.size < 1:
            raise ValueError(f"Beam size must be a positive int, got {self.size!r}")
        if not self.alpha >= 0.0:
            raise ValueError(f"alpha (length penalty) must be >= 0, got {self.alpha}")
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "alpha", float(self.alpha))


Strategy = Greedy | Sample | Beam
