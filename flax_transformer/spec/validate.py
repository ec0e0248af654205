"""Declarative value checks: one rule per field (type, finiteness, range, choices).

A rule says what a value must be and, given a value, what is wrong with it (`problem`, or None).
The same rules check `TransformerConfig` fields, the training options and every numeric
command-line flag (`flax_transformer.cli.flags.flag_type` turns a rule into an argparse `type=`,
so a bad value is an argparse error naming its flag, exit status 2), and the values of a
`--run-config` file.

    FIELD_RULES = {"d_model": Int(min=1), "layer_norm_eps": Float(gt=0), "remat": Bool()}
    problems = field_problems(config, FIELD_RULES)   # ["layer_norm_eps must be > 0, ..."]

Imports numpy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer.spec.tree_check import ConversionError


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_number(value) -> bool:
    return _is_int(value) or isinstance(value, float | np.floating)


@dataclasses.dataclass(frozen=True)
class Int:
    """An int (not a bool) in [min, max]; None allowed when `optional`."""

    min: int | None = None
    max: int | None = None
    optional: bool = False
    why: str = ""  # appended to the range message, e.g. "(0 = off)"

    def describe(self) -> str:
        """The rule in words for messages, e.g. "an int in [1, 8]" or "a positive int", plus
        `why`."""
        if self.min is not None and self.max is not None:
            text = f"an int in [{self.min}, {self.max}]"
        elif self.min in (0, 1):
            text = "a positive int" if self.min else "a non-negative int"
        elif self.min is not None:
            text = f"an int >= {self.min}"
        elif self.max is not None:
            text = f"an int <= {self.max}"
        else:
            text = "an int"
        return text + (f" {self.why}" if self.why else "")

    def problem(self, value) -> str | None:
        """What is wrong with `value` ("must be ..., got ..."), or None when it obeys the rule."""
        if value is None and self.optional:
            return None
        if not _is_int(value):
            return f"must be {self.describe()}, got {value!r}"
        if (self.min is not None and value < self.min) or (
            self.max is not None and value > self.max
        ):
            return f"must be {self.describe()}, got {value!r}"
        return None

    def parse(self, text: str):
        """A flag's text as an int; ValueError if it is not one (flag_type reports it)."""
        return int(text)


@dataclasses.dataclass(frozen=True)
class Float:
    """A finite real number (an int is accepted) with optional bounds: ge/gt below, le/lt above."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    optional: bool = False
    why: str = ""

    def describe(self) -> str:
        """The rule in words for messages, e.g. "a finite number in (0, 1]", plus `why`."""
        low = self.ge if self.ge is not None else self.gt
        high = self.le if self.le is not None else self.lt
        lower = "" if low is None else f"{'>=' if self.ge is not None else '>'} {low:g}"
        upper = "" if high is None else f"{'<=' if self.le is not None else '<'} {high:g}"
        if lower and upper:
            left = "[" if self.ge is not None else "("
            right = "]" if self.le is not None else ")"
            text = f"a finite number in {left}{low:g}, {high:g}{right}"
        elif lower or upper:
            text = f"a finite number {lower or upper}"
        else:
            text = "a finite number"
        return text + (f" {self.why}" if self.why else "")

    def problem(self, value) -> str | None:
        """What is wrong with `value` (not a finite number, or out of bounds), or None when it
        obeys the rule."""
        if value is None and self.optional:
            return None
        if not _is_number(value) or not math.isfinite(value):
            return f"must be {self.describe()}, got {value!r}"
        bad = (
            (self.ge is not None and not value >= self.ge)
            or (self.gt is not None and not value > self.gt)
            or (self.le is not None and not value <= self.le)
            or (self.lt is not None and not value < self.lt)
        )
        return f"must be {self.describe()}, got {value!r}" if bad else None

    def parse(self, text: str):
        """A flag's text as a float; ValueError if it is not a number (flag_type reports it)."""
        return float(text)


@dataclasses.dataclass(frozen=True)
class Bool:
    """A bool (not 0 / 1); None allowed when `optional`."""

    optional: bool = False

    def problem(self, value) -> str | None:
        """The message "must be true or false, got ..." unless `value` is a bool, else None."""
        if isinstance(value, bool) or (value is None and self.optional):
            return None
        return f"must be true or false{' or None' if self.optional else ''}, got {value!r}"


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `options` (plain values); None allowed when `optional`."""

    options: tuple
    optional: bool = False

    def problem(self, value) -> str | None:
        """The message "must be one of ..., got ..." unless `value` is an option, else None."""
        if value is None and self.optional:
            return None
        if isinstance(value, str | int | float | bool | type(None)) and value in self.options:
            return None
        return f"must be one of {self.options}, got {value!r}"


@dataclasses.dataclass(frozen=True)
class Text:
    """A string (a path, a spec parsed elsewhere)."""

    optional: bool = True

    def problem(self, value) -> str | None:
        """The message "must be a string, got ..." unless `value` is a str (or None when
        optional), else None."""
        if value is None and self.optional:
            return None
        return None if isinstance(value, str) else f"must be a string, got {value!r}"


@dataclasses.dataclass(frozen=True)
class Floats:
    """A non-empty list (or tuple) of finite numbers > 0; None allowed when `optional`."""

    optional: bool = True

    def problem(self, value) -> str | None:
        """The message "must be a list of finite numbers > 0, got ..." unless `value` is one
        (or None when optional), else None."""
        if value is None and self.optional:
            return None
        ok = isinstance(value, list | tuple) and len(value) > 0
        ok = ok and all(_is_number(v) and math.isfinite(v) and v > 0 for v in value)
        return None if ok else f"must be a list of finite numbers > 0, got {value!r}"


Rule = Int | Float | Bool | Choice | Text | Floats
SEED = Int(min=0, max=2**32 - 1)  # what both numpy's and JAX's PRNGs accept


def field_problems(obj: Any, rules: Mapping[str, Rule]) -> list[str]:
    """'name problem' for every field of `obj` (an object or a mapping) its rule rejects."""
    get = obj.get if isinstance(obj, Mapping) else lambda name: getattr(obj, name)
    problems = []
    for name, rule in rules.items():
        problem = rule.problem(get(name))
        if problem:
            problems.append(f"{name} {problem}")
    return problems


# ----------------------------------------------------------------------------- weights
def weight_problems(tensors: Mapping[str, Any], *, allow_nonfinite: bool = False) -> list[str]:
    """Weights must be floating point and (unless allowed) finite; one line per bad tensor."""
    problems = []
    for name, value in tensors.items():
        # The dtype without reading: a lazily read tensor is read only for the values.
        dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype
        if not np.issubdtype(dtype, np.floating) and dtype.name != "bfloat16":
            problems.append(f"tensor {name!r} has dtype {dtype}; weights must be floating point")
            continue
        if not allow_nonfinite:
            array = np.asarray(value)
            finite = np.isfinite(
                array.astype(np.float32) if array.dtype.name == "bfloat16" else array
            )
            if not finite.all():
                bad = int(array.size - np.count_nonzero(finite))
                problems.append(f"tensor {name!r} has {bad} non-finite value(s) (nan/inf)")
    return problems


def check_weights(tensors: Mapping[str, Any], where: str, *, allow_nonfinite: bool = False):
    """Raise one ConversionError naming every tensor that is not floating point or (unless
    `allow_nonfinite`) holds nan/inf: integer weights would run, and silently compute garbage."""
    problems = weight_problems(tensors, allow_nonfinite=allow_nonfinite)
    if problems:
        hint = "" if allow_nonfinite else " (non-finite weights: --allow-nonfinite to accept)"
        if all("non-finite" not in p for p in problems):
            hint = ""
        raise ConversionError(
            f"{where}: {len(problems)} bad tensor(s){hint}:\n  " + "\n  ".join(problems)
        )


# ----------------------------------------------------------------------------- token ids
def token_id_problem(name: str, tokens, vocab_size: int) -> str | None:
    """'src holds token id 300, outside the vocabulary [0, 259)' for concrete host/device
    arrays; None when every id is inside. Callers skip traced values (they have no values)."""
    array = np.asarray(tokens)
    if array.size == 0:
        return None
    low, high = int(array.min()), int(array.max())
    if low >= 0 and high < vocab_size:
        return None
    bad = low if low < 0 else high
    where = np.argwhere(array == bad)[0].tolist()
    return (
        f"{name} holds token id {bad} at position {tuple(where)}, outside the vocabulary "
        f"[0, {vocab_size})"
    )
