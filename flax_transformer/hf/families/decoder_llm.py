"""What the Llama-lineage decoder families share (llama.py, mistral.py, qwen2.py, qwen3.py):
a pre-norm decoder-only LM with RMS norms (`rms_norm_eps`) and a final norm, a SwiGLU
feed-forward (`gate_proj` activated, times `up_proj`, then `down_proj`), rotary positions on
q and k with transformers' scaling rules, grouped-query attention (`num_key_value_heads`),
an explicit `head_dim`, no biases but where a family has them, a tied or untied `lm_head`.

Rotary options are read in both layouts: transformers 5's `rope_parameters` (rope_theta and
the scaling folded in) and transformers 4's `rope_theta` + `rope_scaling` (with `type` or
`rope_type`). A family module gives its config class's defaults and its own switches (biases,
q/k norms, how its sliding window is declared); `family()` builds its Family.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

from flax_transformer.hf.families.family import Family, HFConfig, first_id
from flax_transformer.hf.families.field_types import (
    FieldType,
    boolean,
    integer,
    number,
    probability,
)
from flax_transformer.spec.config import MAX_LEN_LIMIT
from flax_transformer.spec.kinds import LM

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
# The rope_parameters keys each rule reads (besides rope_type / type and rope_theta).
ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
}
_NUMBERS = {"factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast"}
_NUMBERS |= {"beta_slow", "mscale", "mscale_all_dim"}
# partial_rotary_factor 1.0 is the whole head: the only value these families use.
_IGNORED_ROPE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}

REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
REQUIRED += ("num_attention_heads",)
FIELD_TYPES = dict(  # LlamaConfig's (and its kin's) declared types
    vocab_size=integer(),
    hidden_size=integer(),
    intermediate_size=integer(),
    num_hidden_layers=integer(),
    num_attention_heads=integer(),
    num_key_value_heads=integer(optional=True),
    head_dim=integer(optional=True),
    hidden_act=FieldType("str"),
    max_position_embeddings=integer(),
    rms_norm_eps=number(min=0, min_exclusive=True),
    rope_theta=number(min=0, min_exclusive=True, optional=True),
    attention_dropout=probability(),
    attention_bias=boolean(),
    mlp_bias=boolean(),
    sliding_window=integer(optional=True),
    use_sliding_window=boolean(),
    max_window_layers=integer(minimum=0),
    layer_types=FieldType("strs", optional=True),
)


def rope_switches(hf: HFConfig, problems: list[str]) -> dict:
    """The rope_* TransformerConfig fields of config.json (either layout); what cannot be
    expressed goes to `problems`."""
    params = hf.get("rope_parameters")
    if params is None:
        params = hf.get("rope_scaling")
    params = {} if params is None else params
    if not isinstance(params, dict):
        problems.append(f"rope_parameters: must be an object, got {params!r}")
        return {}
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    rule = params.get("rope_type", params.get("type", "default"))
    if rule not in ROPE_TYPES:
        problems.append(
            f"rope_parameters: rope_type {rule!r} is not supported (supported: "
            f"{', '.join(ROPE_TYPES)}; per-layer-type rope_parameters neither)"
        )
        return {}
    unknown = sorted(set(params) - ROPE_KEYS[rule] - _IGNORED_ROPE_KEYS)
    if unknown:
        problems.append(f"rope_parameters: {', '.join(unknown)} not read by rope_type {rule!r}")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        problems.append(f"partial_rotary_factor={partial!r} (only 1.0 is supported)")
    bad = [k for k in _NUMBERS & set(params) if not _is_number(params[k], none_ok=True)]
    if not _is_number(theta) or theta <= 0:
        bad.append("rope_theta")
    if bad:
        problems.append(f"rope_parameters: {', '.join(sorted(bad))} must be numbers")
        return {}
    fields = dict(rope_theta=float(theta), rope_scaling=rule)
    max_pos = hf["max_position_embeddings"]
    original = params.get("original_max_position_embeddings")
    original = hf.get("original_max_position_embeddings", original) or max_pos
    factor = params.get("factor")
    if rule == "yarn" and factor is None:
        factor = max_pos / original
    if rule != "default":
        if factor is None:
            problems.append(f"rope_parameters: rope_type {rule!r} needs factor")
            return {}
        fields["rope_factor"] = float(factor)
    if rule == "dynamic":
        fields["rope_original_max_len"] = max_pos
    if rule in ("llama3", "yarn"):
        fields["rope_original_max_len"] = original
    if rule == "llama3":
        missing = [k for k in ("low_freq_factor", "high_freq_factor") if params.get(k) is None]
        if missing:
            problems.append(f"rope_parameters: rope_type 'llama3' needs {', '.join(missing)}")
            return {}
        fields.update(
            rope_low_freq_factor=float(params["low_freq_factor"]),
            rope_high_freq_factor=float(params["high_freq_factor"]),
        )
    if rule == "yarn":
        fields.update(
            rope_beta_fast=float(params.get("beta_fast") or 32),
            rope_beta_slow=float(params.get("beta_slow") or 1),
            rope_attention_factor=_float_or_none(params.get("attention_factor")),
            rope_mscale=_float_or_none(params.get("mscale")),
            rope_mscale_all_dim=_float_or_none(params.get("mscale_all_dim")),
            rope_truncate=bool(params.get("truncate", True)),
        )
    return fields


def _is_number(value, none_ok: bool = False) -> bool:
    if value is None:
        return none_ok
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value)


def _float_or_none(value):
    return None if value is None else float(value)


def max_len(hf: HFConfig, rope: dict) -> int:
    """The longest sequence: max_position_embeddings (the dynamic rule: times its factor, the
    length it stretches to), at most MAX_LEN_LIMIT (Llama 3.1's 131072 is past it)."""
    length = hf["max_position_embeddings"]
    if rope.get("rope_scaling") == "dynamic":
        length = int(length * rope["rope_factor"])
    return min(length, MAX_LEN_LIMIT)


def layer_types_window(hf: HFConfig, problems: list[str]) -> int:
    """sliding_window_from_layer of config.json's `layer_types` (full attention first, then
    sliding): the first sliding layer; another order goes to `problems`."""
    types = hf.get("layer_types")
    layers = hf["num_hidden_layers"]
    if types is None:
        return hf.get("max_window_layers", 28)
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        problems.append(
            f"layer_types: must list {layers} of 'full_attention' / 'sliding_attention', "
            f"got {types}"
        )
        return 0
    first = types.index("sliding_attention") if "sliding_attention" in types else layers
    if any(t != "sliding_attention" for t in types[first:]):
        problems.append(
            "layer_types: sliding layers after full ones only are supported (Qwen2's "
            f"max_window_layers), got {types}"
        )
    return first


def config_switches(hf: HFConfig, problems: list[str], defaults: dict) -> dict:
    """The TransformerConfig fields every family here shares, `defaults` (the config class's)
    under config.json."""
    hf = {**defaults, **hf}
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
        problems.append(
            f"num_attention_heads: {heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    rope = rope_switches(hf, problems)
    eos, pad = first_id(hf.get("eos_token_id")), hf.get("pad_token_id")
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        num_heads=heads,
        num_kv_heads=kv_heads,
        attention_head_dim=head_dim,
        num_encoder_layers=0,
        num_decoder_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        dropout_rate=0.0,
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        max_len=max_len(hf, rope) if "max_position_embeddings" in hf else 2048,
        norm_type="rms",
        layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_first=True,
        final_norm=True,
        use_bias=False,
        gated_ffn=True,
        positional="rotary",
        tie_output=hf.get("tie_word_embeddings", False),
        # No pad token in most: masks come from attention_mask; pad_id only names a filler.
        pad_id=pad if pad is not None else (eos if eos is not None else 0),
        **rope,
    )


def renames(hf: HFConfig) -> tuple[tuple[str, str], ...]:
    """(transformers' name, this project's) of every weight of these decoders."""
    attention = "model.layers.{i}.self_attn."
    ours = "decoder.layers.{i}."
    return (
        ("model.embed_tokens.weight", "tgt_embed.weight"),
        ("model.norm.weight", "decoder.norm.weight"),
        ("lm_head.weight", "lm_head.weight"),
        ("model.layers.{i}.input_layernorm.weight", ours + "norm1.weight"),
        ("model.layers.{i}.post_attention_layernorm.weight", ours + "norm2.weight"),
        (attention + "q_proj.{p}", ours + "self_attn.query.{p}"),
        (attention + "k_proj.{p}", ours + "self_attn.key.{p}"),
        (attention + "v_proj.{p}", ours + "self_attn.value.{p}"),
        (attention + "o_proj.{p}", ours + "self_attn.out.{p}"),
        (attention + "q_norm.weight", ours + "self_attn.query_norm.weight"),
        (attention + "k_norm.weight", ours + "self_attn.key_norm.weight"),
        ("model.layers.{i}.mlp.gate_proj.{p}", ours + "ffn.linear1.{p}"),
        ("model.layers.{i}.mlp.up_proj.{p}", ours + "ffn.linear3.{p}"),
        ("model.layers.{i}.mlp.down_proj.{p}", ours + "ffn.linear2.{p}"),
    )


def family(
    model_type: str,
    architecture: str,
    switches: Callable[[HFConfig, list[str], list[str]], dict],
    field_types: dict | None = None,
    **overrides,
) -> Family:
    """The Family of one of these decoders: `switches` its config_to_switches; `overrides`
    replace the shared Family fields (another activation key, other weight names)."""
    shared = Family(
        model_types=(model_type,),
        kind=LM,
        architectures=(f"{architecture}ForCausalLM", f"{architecture}Model"),
        required=REQUIRED,
        legacy_values={},
        default_activation="silu",
        activation_key="hidden_act",
        config_to_switches=switches,
        weight_renames=renames,
        prefix="model.",
        tied_groups=lambda hf: [["model.embed_tokens.weight", "lm_head.weight"]],
        # transformers 4.3x and older checkpoints stored the rotary frequencies: a constant.
        ignored_keys=re.compile(r"\.rotary_emb\.inv_freq$"),
        field_types={**FIELD_TYPES, **(field_types or {})},
        width_and_heads=(),
        bare_architectures=(f"{architecture}Model",),
    )
    return dataclasses.replace(shared, **overrides)
