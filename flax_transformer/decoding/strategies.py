"""Decoding strategies, how the next token is chosen: `Greedy()`, `Sample(...)`, `Beam(...)`.

A strategy is a small frozen dataclass, checked when it is built, and a JAX pytree: its numbers
(temperature, top_k, top_p, alpha) are traced leaves, so decoding with another value does not
recompile; its class and `Beam.size` (an array dimension) are static.
"""

from __future__ import annotations

import dataclasses

import jax

from flax_transformer.spec.validate import Float, Int, field_problems


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


# The strategies' numbers (spec/validate.py rules; the generate CLI checks its flags with them).
SAMPLE_RULES = {
    "temperature": Float(ge=0.0, why="(0 = greedy)"),
    "top_k": Int(min=0, why="(0 = off)"),
    "top_p": Float(gt=0.0, le=1.0, why="(1 = off)"),
}
BEAM_RULES = {"size": Int(min=1), "alpha": Float(ge=0.0, why="(the length penalty exponent)")}


def _check(strategy, rules, prefix: str = "") -> None:
    problems = field_problems(strategy, rules)
    if problems:
        raise ValueError(prefix + "; ".join(problems))


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
        _check(self, SAMPLE_RULES)
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
        _check(self, BEAM_RULES, "Beam ")
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "alpha", float(self.alpha))


Strategy = Greedy | Sample | Beam
