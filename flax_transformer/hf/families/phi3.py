"""Phi-3: the shared decoder (decoder_llm.py) with its query | key | value projections fused
in one `qkv_proj` (grouped-query: q wider than k and v) and its gate | up projections in one
`gate_up_proj`, split on load and concatenated back on save (bit-exact); `longrope` rotary
scaling (`short_factor` / `long_factor` tables, the long one for a forward call whose largest
position + 1 passes `original_max_position_embeddings`; transformers 4's "su" is it too);
partial rotary (`partial_rotary_factor`, in `rope_parameters` in transformers 5)."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import FusedQKV, HFConfig
from flax_transformer.hf.families.field_types import integer, number

DEFAULTS = dict(
    max_position_embeddings=4096,
    original_max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    pad_token_id=32000,
)
OURS = "decoder.layers.{i}."


def rope_parameters(hf: HFConfig, problems: list[str]) -> tuple[dict, dict]:
    """(config.json with its longrope parameters taken out, the rotary switches they give)."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        return hf, {}  # rope_switches names it
    rule = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    switches = {"rotary_fraction": float(partial)} if partial != 1.0 else {}
    if rule not in ("longrope", "su"):
        rest = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
        return {**hf, "rope_parameters": rest, "partial_rotary_factor": 1.0}, switches
    original = params.get("original_max_position_embeddings")
    original = original or hf.get("original_max_position_embeddings")
    original = original or hf["max_position_embeddings"]
    factor = params.get("factor") or hf["max_position_embeddings"] / original
    switches.update(
        rope_scaling="longrope",
        rope_original_max_len=original,
        rope_factor=float(factor),
        rope_short_factors=params.get("short_factor"),
        rope_long_factors=params.get("long_factor"),
        rope_attention_factor=params.get("attention_factor"),
    )
    plain = dict(rope_type="default", rope_theta=params.get("rope_theta", hf.get("rope_theta")))
    plain = {k: v for k, v in plain.items() if v is not None}
    return {**hf, "rope_parameters": plain, "partial_rotary_factor": 1.0}, switches


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Phi-3 config.json."""
    hf = {**DEFAULTS, **hf}
    if hf.get("sliding_window") is not None:
        problems.append("sliding_window: Phi-3 windows are not supported (null only)")
    plain, rope = rope_parameters(hf, problems)
    return {**decoder_llm.config_switches(plain, problems, DEFAULTS), **rope}


def qkv_widths(hf: HFConfig) -> tuple[int, int, int]:
    """qkv_proj's query, key and value widths (heads x head_dim; kv_heads x head_dim)."""
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    kv = (hf.get("num_key_value_heads") or heads) * head_dim
    return heads * head_dim, kv, kv


def renames(hf: HFConfig) -> tuple[tuple[str, str], ...]:
    """The shared decoder's names but the fused ones (FusedQKV)."""
    fused = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    return tuple(r for r in decoder_llm.renames(hf) if not any(f in r[0] for f in fused))


PHI3 = decoder_llm.family(
    "phi3",
    "Phi3",
    config_to_switches,
    dict(
        original_max_position_embeddings=integer(optional=True),
        partial_rotary_factor=number(min=0, min_exclusive=True, optional=True),
        resid_pdrop=number(min=0),
        embd_pdrop=number(min=0),
    ),
    weight_renames=renames,
    fused_qkv=FusedQKV(
        "model.layers.{i}.self_attn.qkv_proj.{p}",
        OURS + "self_attn.{name}.{p}",
        transposed=False,
        sizes=qkv_widths,
    ),
    fused_ffn=FusedQKV(
        "model.layers.{i}.mlp.gate_up_proj.{p}",
        OURS + "ffn.{name}.{p}",
        transposed=False,
        names=("linear1", "linear3"),
    ),
)
