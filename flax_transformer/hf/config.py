"""A Hugging Face config.json (any family of hf/families/) as this project's TransformerConfig.

JAX-free: plain dict work. Every value of the wrong type (the types transformers' config classes
declare, hf/families/field_types.py), missing required key and option the model cannot express
is collected and raised in one UnsupportedConfigError, one line per problem; options that only
change training (layer drop, dropout values with no place here) are returned as warnings. What
differs between families is each family's (hf/families/); this module does what they share.
See docs/hf.md for the mapping.
"""

from __future__ import annotations

from typing import Any

from flax_transformer.hf.families import FAMILIES, MODEL_TYPES, family_for
from flax_transformer.hf.families.family import UnsupportedConfigError, first_id
from flax_transformer.hf.families.field_types import config_problems
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import SEQ2SEQ

# The registry's tables, by model_type (kept for callers of the names this module had).
SEQ2SEQ_TYPES = tuple(t for f in FAMILIES if f.kind == SEQ2SEQ for t in f.model_types)
ARCHITECTURES = {t: f.architectures for f in FAMILIES for t in f.model_types}
LEGACY_VALUES = {t: dict(f.legacy_values) for f in FAMILIES for t in f.model_types}
REQUIRED = {t: f.required for f in FAMILIES for t in f.model_types}

# transformers' ACT2FN names -> ours ("gelu" there is the exact erf GELU, as here).
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "silu",
    "silu": "silu",
}

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURES",
    "LEGACY_VALUES",
    "MODEL_TYPES",
    "REQUIRED",
    "SEQ2SEQ_TYPES",
    "UnsupportedConfigError",
    "check_hf_config",
    "first_id",
    "hf_to_config",
    "model_kind",
]


def model_kind(hf_config: dict[str, Any]) -> str:
    """The project's model kind for a config: "seq2seq", "lm" or "encoder" (a bare encoder),
    from its family and architecture."""
    return family_for(hf_config.get("model_type")).kind_for(hf_config)


def _raise(where: str, model_type: str, problems: list[str]):
    """One UnsupportedConfigError: the file, then one line per problem, each naming its key."""
    lines = "\n  ".join(problems)
    raise UnsupportedConfigError(
        f"{where}: {len(problems)} problem(s) with this {model_type} config (nothing was "
        f"loaded):\n  {lines}"
    )


def check_hf_config(hf_config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """config.json checked against the types its family declares (hf/families/field_types.py):
    every missing required key, wrongly typed value and width its heads do not divide in one
    UnsupportedConfigError. Returns a copy with integral floats (512.0) as ints."""
    model_type = hf_config.get("model_type")
    family = family_for(model_type, where)
    checked, problems = config_problems(hf_config, family)
    if problems:
        _raise(where, model_type, problems)
    return checked


def hf_to_config(
    hf_config: dict[str, Any], dtype: str = "float32", where: str = "config.json"
) -> tuple[TransformerConfig, list[str]]:
    """(TransformerConfig, training-only warnings) for a Hugging Face config dict.

    Raises UnsupportedConfigError naming every value of the wrong type and every option that
    cannot be expressed.
    """
    model_type = hf_config.get("model_type")
    family = family_for(model_type, where)
    hf_config, problems = config_problems(hf_config, family)
    typed = not problems  # the family's mapping reads values of the declared types only
    warnings: list[str] = []
    for name, value in family.legacy_values.items():
        if name in hf_config and hf_config[name] != value:
            problems.append(f"{name}={hf_config[name]!r} (only {value!r} is supported)")
    architectures = hf_config.get("architectures") or []
    listed = architectures if isinstance(architectures, list) else []  # else a type problem
    unknown = [a for a in listed if a not in family.architectures]
    if unknown:
        problems.append(f"architectures={unknown} (supported: {', '.join(family.architectures)})")
    activation = family.activation(hf_config)
    if isinstance(activation, str) and activation not in ACTIVATIONS:
        problems.append(
            f"{family.activation_key}={activation!r} (supported: {', '.join(ACTIVATIONS)})"
        )
    fields = family.config_to_switches(hf_config, problems, warnings) if typed else {}
    if problems:
        _raise(where, model_type, problems)
    fields.update(
        activation=ACTIVATIONS[activation],
        dtype=dtype,
        param_dtype=dtype,
        lm_head_bias=False,  # transformers' heads have no bias
        mask_target_padding=False,  # decoders are causal only unless a mask is given
        bos_id=hf_config.get("bos_token_id"),
        eos_id=first_id(hf_config.get("eos_token_id")),
    )
    # transformers only warns about special ids outside the vocabulary; so do we, and drop them.
    for name in ("bos_id", "eos_id", "decoder_start_id", "pad_id"):
        value = fields.get(name)
        if value is not None and not 0 <= value < fields["tgt_vocab_size"]:
            warnings.append(f"{name} {value} is outside the vocabulary: not used")
            fields[name] = 0 if name == "pad_id" else None
    try:
        return TransformerConfig(**fields), warnings
    except ValueError as err:
        raise UnsupportedConfigError(f"{where}: {err}") from None
