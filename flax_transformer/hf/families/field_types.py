"""config.json's value types, as transformers' config classes declare them, checked before any
value is used: `"scale_embedding": "false"` is a string (Python would read it as True), `"d_model":
"512"` a string, `24.5` a width with a fraction. Each family declares the types of the fields it
reads (`Family.field_types`, built from the constructors here); `config_problems` checks a
config.json against them, with the required keys and the widths the heads must divide.

    config, problems = config_problems(hf_config, family)
    # problems: ["scale_embedding: must be true or false (a JSON boolean), got the string 'false'"]

A float without a fraction (`512.0`) is an int, as Python's json would compare it: `config`
holds it as 512. Plain Python only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # family.py imports this module
    from flax_transformer.hf.families.family import Family


def _shown(value) -> str:
    """The value as a reader of config.json sees it: `the string 'false'`, `true`, `null`."""
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


def _as_int(value) -> int | None:
    """An int, or a float without a fraction as an int; None for anything else (bools too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


@dataclasses.dataclass(frozen=True)
class FieldType:
    """One config.json field's type: `kind` int | float | bool | str | token_ids | strs, null
    allowed when `optional`, numbers bounded by `min` (and `max`)."""

    kind: str
    optional: bool = False
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False  # `min` itself refused (an epsilon > 0)

    def describe(self) -> str:
        """The type in words: "an integer >= 1", "true or false (a JSON boolean)", ..."""
        text = {
            "int": "an integer",
            "float": "a finite number",
            "bool": "true or false (a JSON boolean)",
            "str": "a string",
            "token_ids": "a token id (an integer) or a list of them",
            "strs": "a list of strings",
        }[self.kind]
        if self.min is not None and self.max is not None:
            text += f" in [{self.min:g}, {self.max:g}]"
        elif self.min is not None:
            text += f" {'>' if self.min_exclusive else '>='} {self.min:g}"
        return text + (" or null" if self.optional else "")

    def check(self, value) -> tuple[Any, str | None]:
        """(the value as used: integral floats made ints, the problem or None)."""
        if value is None:
            return value, None if self.optional else f"must be {self.describe()}, got null"
        checked = self._typed(value)
        if checked is None or not self._in_range(checked):
            return value, f"must be {self.describe()}, got {_shown(value)}"
        return checked, None

    def _typed(self, value):
        """The value if it has the kind's type (integral floats as ints), else None."""
        if self.kind == "int":
            return _as_int(value)
        if self.kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return value if ok and math.isfinite(value) else None
        if self.kind == "bool":
            return value if isinstance(value, bool) else None
        if self.kind == "str":
            return value if isinstance(value, str) else None
        if self.kind == "strs":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            return value if ok else None
        if isinstance(value, list):  # token_ids: one id or a list of them
            ids = [_as_int(v) for v in value]
            return None if any(i is None for i in ids) else ids
        return _as_int(value)

    def _in_range(self, value) -> bool:
        if self.min is None or not isinstance(value, int | float):
            return True
        low = value > self.min if self.min_exclusive else value >= self.min
        return low and (self.max is None or value <= self.max)


def integer(minimum: int = 1, optional: bool = False) -> FieldType:
    """An int field (a size: at least 1 unless `minimum` says otherwise)."""
    return FieldType("int", optional=optional, min=minimum)


def number(optional: bool = False, **bounds) -> FieldType:
    """A float field (transformers' `float | int`): a finite number within `bounds`."""
    return FieldType("float", optional=optional, **bounds)


def probability(optional: bool = False) -> FieldType:
    """A dropout rate: a number in [0, 1]."""
    return FieldType("float", optional=optional, min=0, max=1)


def boolean(optional: bool = False) -> FieldType:
    """A bool field: JSON true or false, never "false" or 0."""
    return FieldType("bool", optional=optional)


TOKEN_ID = FieldType("int", optional=True)  # `int | None`; outside the vocabulary: a warning
TOKEN_IDS = FieldType("token_ids", optional=True)  # `int | list[int] | None` (eos_token_id)

# The fields every family reads (hf/config.py, generation), as transformers declares them.
COMMON = {
    "model_type": FieldType("str"),
    "architectures": FieldType("strs", optional=True),
    "activation_function": FieldType("str"),
    "tie_word_embeddings": boolean(),
    "bos_token_id": TOKEN_ID,
    "eos_token_id": TOKEN_IDS,
    "pad_token_id": TOKEN_ID,
    "decoder_start_token_id": TOKEN_ID,
    "forced_bos_token_id": TOKEN_ID,
    "forced_eos_token_id": TOKEN_IDS,
}


def config_problems(hf_config: Mapping[str, Any], family: Family) -> tuple[dict, list[str]]:
    """(config.json with integral floats as ints, "key: problem" for every missing required
    key, every value of the wrong type, and every width its heads do not divide)."""
    config, problems = dict(hf_config), []
    missing = [name for name in family.required if hf_config.get(name) is None]
    if missing:
        problems.append(f"{family.name} config lacks {', '.join(missing)} (required)")
    for name, field_type in {**COMMON, **family.field_types}.items():
        if name in hf_config and name not in missing:
            config[name], problem = field_type.check(hf_config[name])
            if problem:
                problems.append(f"{name}: {problem}")
    problems += label_problems(hf_config)
    bad, said = {p.split(":")[0] for p in problems} | set(missing), set()
    for width, heads in family.width_and_heads:
        if {width, heads} & bad or config.get(width) is None or config.get(heads) is None:
            continue
        if config[width] % config[heads] and (width, config[heads]) not in said:
            said.add((width, config[heads]))  # encoder and decoder heads alike: said once
            problems.append(
                f"{width}: {config[width]} is not divisible by {heads}={config[heads]} "
                "(each head takes an equal slice of the width)"
            )
    return config, problems


def label_problems(hf_config: Mapping[str, Any]) -> list[str]:
    """What is wrong with a classifier's labels: `id2label` must map the integers 0..n-1 (as JSON
    strings) to names, and a `num_labels` beside it must say n. transformers builds the head
    from one key and the weights may follow the other, so a disagreement is refused here
    rather than guessed (the model would load, then export a config transformers refuses)."""
    id2label, stated = hf_config.get("id2label"), hf_config.get("num_labels")
    if id2label is None:
        return []
    if not isinstance(id2label, Mapping):
        return [f"id2label: must be an object {{class id: label name}}, got {_shown(id2label)}"]
    keys = [_as_int(key) if not isinstance(key, str) else _int_text(key) for key in id2label]
    bad = [key for key, number in zip(id2label, keys, strict=True) if number is None]
    if bad:
        return [f"id2label: keys must be class ids (integers), got {_shown(bad[0])}"]
    if sorted(keys) != list(range(len(keys))):
        return [f"id2label: class ids must be 0..{len(keys) - 1}, got {sorted(keys)}"]
    if stated is not None and _as_int(stated) != len(keys):
        return [
            f"num_labels: {_shown(stated)} disagrees with id2label, which names {len(keys)} "
            "labels (make them agree)"
        ]
    return []


def _int_text(text: str) -> int | None:
    """A JSON object key read as an integer ("3" -> 3), or None."""
    try:
        return int(text.strip())
    except ValueError:
        return None
