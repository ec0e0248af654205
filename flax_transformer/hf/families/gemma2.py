"""Gemma 2: Gemma's decoder (gemma.py) with tanh soft-capping of the attention logits
(`attn_logit_softcapping`) and of the final logits (`final_logit_softcapping`), the logits
scaled by `query_pre_attn_scalar` ** -0.5 instead of head_dim's, local sliding-window and
global layers alternating (config.json's `layer_types`, by default sliding first), and norms
before and after both the attention and the feed-forward (`post_attention_layernorm` and
`post_feedforward_layernorm` on the sublayers' outputs; `pre_feedforward_layernorm` before
the feed-forward). The activation is `hidden_activation`."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.gemma import FIELD_TYPES, TANH_GELU, gemma_switches

DEFAULTS = dict(
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    num_key_value_heads=4,
    head_dim=256,
    pad_token_id=0,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0,
)
LAYER_LETTERS = {"sliding_attention": "s", "full_attention": "f"}


def layer_pattern(hf: HFConfig, problems: list[str], every: int) -> dict:
    """sliding_window / sliding_window_pattern of config.json's `layer_types` (one letter a
    layer), else of every `every`-th layer global (transformers' default layer_types)."""
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        types = [
            "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
        ]
    if len(types) != layers or set(types) - set(LAYER_LETTERS):
        problems.append(
            f"layer_types: must list {layers} of 'full_attention' / 'sliding_attention', "
            f"got {types}"
        )
        return {}
    pattern = "".join(LAYER_LETTERS[t] for t in types)
    window = hf.get("sliding_window")
    if window is None or "s" not in pattern:
        return dict(sliding_window=None, sliding_window_pattern=None)
    return dict(sliding_window=window, sliding_window_pattern=pattern)


def soft_capping_switches(hf: HFConfig) -> dict:
    """The logit scale and the two soft caps of a Gemma 2 / 3 config.json."""
    return dict(
        attention_scale_dim=float(hf["query_pre_attn_scalar"]),
        attention_logit_softcap=hf.get("attn_logit_softcapping"),
        final_logit_softcap=hf.get("final_logit_softcapping"),
        sublayer_output_norm=True,
    )


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Gemma 2 config.json."""
    hf = {**DEFAULTS, **hf}
    fields = gemma_switches(hf, problems, DEFAULTS)
    return {**fields, **soft_capping_switches(hf), **layer_pattern(hf, problems, every=2)}


def renames(hf: HFConfig) -> tuple[tuple[str, str], ...]:
    """The shared decoder's names, with the four norms of a Gemma 2 / 3 layer."""
    layer, ours = "model.layers.{i}.", "decoder.layers.{i}."
    norms = {
        layer + "post_attention_layernorm.weight": ours + "attn_out_norm.weight",
        layer + "pre_feedforward_layernorm.weight": ours + "norm2.weight",
        layer + "post_feedforward_layernorm.weight": ours + "ffn_out_norm.weight",
    }
    shared = [r for r in decoder_llm.renames(hf) if r[0] not in norms]
    return (*shared, *norms.items())


GEMMA2 = decoder_llm.family(
    "gemma2",
    "Gemma2",
    config_to_switches,
    FIELD_TYPES,
    default_activation=TANH_GELU,
    activation_key="hidden_activation",
    weight_renames=renames,
)
