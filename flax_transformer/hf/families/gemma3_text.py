"""Gemma 3 (text, `Gemma3ForCausalLM`, model_type gemma3_text): Gemma 2's decoder (gemma2.py)
with offset RMS norms over each head of the queries and keys (`q_norm`, `k_norm`), no
soft-capping unless config.json asks, every `sliding_window_pattern`-th layer global (6 unless
config.json's `layer_types` say), and two rotary tables: the local (sliding) layers turn by
their own unscaled base, the global layers by the scaled one.

transformers 5 nests the rope parameters per layer type (`rope_parameters` = {"full_attention":
{...}, "sliding_attention": {...}}); transformers 4 wrote `rope_theta` (global), `rope_scaling`
(global) and `rope_local_base_freq`: both are read."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
import flax_transformer.hf.families.gemma2 as gemma2
from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.field_types import integer, number
from flax_transformer.hf.families.gemma import FIELD_TYPES, TANH_GELU, gemma_switches
from flax_transformer.hf.families.gemma2 import layer_pattern, renames, soft_capping_switches

# Gemma 2's defaults (Gemma3TextConfig's are the same), but the longer context and no
# soft-capping.
DEFAULTS = dict(
    gemma2.DEFAULTS,
    max_position_embeddings=131072,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
)
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma3TextConfig.default_theta


def rope_by_layer_type(hf: HFConfig, problems: list[str]) -> tuple[dict, float]:
    """(the global layers' rope_parameters, the local layers' base) of either layout."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and set(params) & {"full_attention", "sliding_attention"}:
        unknown = sorted(set(params) - {"full_attention", "sliding_attention"})
        if unknown:
            problems.append(f"rope_parameters: layer types {unknown} are not read")
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", local.get("type", "default")) != "default":
            problems.append(
                "rope_parameters.sliding_attention: only rope_type 'default' is supported for "
                f"the local layers, got {local}"
            )
        full.setdefault("rope_theta", hf.get("rope_theta", GLOBAL_THETA))
        return full, local.get("rope_theta", hf.get("rope_local_base_freq", LOCAL_THETA))
    full = dict(params if isinstance(params, dict) else hf.get("rope_scaling") or {})
    full.setdefault("rope_theta", hf.get("rope_theta", GLOBAL_THETA))
    return full, hf.get("rope_local_base_freq", LOCAL_THETA)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Gemma 3 text config.json."""
    hf = {**DEFAULTS, **hf}
    full, local_theta = rope_by_layer_type(hf, problems)
    flat = {k: v for k, v in hf.items() if k not in ("rope_scaling", "rope_theta")}
    fields = gemma_switches({**flat, "rope_parameters": full}, problems, DEFAULTS)
    every = hf.get("sliding_window_pattern", 6)
    return {
        **fields,
        **soft_capping_switches(hf),
        **layer_pattern(hf, problems, every=every),
        "qk_norm": True,
        "rope_local_theta": float(local_theta),
    }


GEMMA3_TEXT = decoder_llm.family(
    "gemma3_text",
    "Gemma3",
    config_to_switches,
    {
        **FIELD_TYPES,
        "sliding_window_pattern": integer(optional=True),
        "rope_local_base_freq": number(min=0, min_exclusive=True, optional=True),
    },
    architectures=("Gemma3ForCausalLM", "Gemma3TextModel"),
    bare_architectures=("Gemma3TextModel",),
    default_activation=TANH_GELU,
    activation_key="hidden_activation",
    weight_renames=renames,
)
