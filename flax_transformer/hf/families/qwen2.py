"""Qwen2 / Qwen2.5: the shared decoder (decoder_llm.py) with biases on q, k and v (none on
o_proj or the feed-forward), and a sliding window (`use_sliding_window`, `sliding_window`) in
the layers from `max_window_layers` on (or as config.json's `layer_types` list them)."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig

DEFAULTS = dict(
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    num_key_value_heads=32,
    use_sliding_window=False,
    sliding_window=4096,
    max_window_layers=28,
)


def window_switches(hf: HFConfig, problems: list[str]) -> dict:
    """sliding_window / sliding_window_from_layer as Qwen2Config derives its layer_types."""
    hf = {**DEFAULTS, **hf}
    window = hf["sliding_window"] if hf["use_sliding_window"] else None
    first = decoder_llm.layer_types_window(hf, problems)
    if window is None or first >= hf["num_hidden_layers"]:
        return dict(sliding_window=None, sliding_window_from_layer=0)
    return dict(sliding_window=window, sliding_window_from_layer=first)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Qwen2 config.json."""
    fields = decoder_llm.config_switches(hf, problems, DEFAULTS)
    return {**fields, **window_switches(hf, problems), "qkv_bias": True}


QWEN2 = decoder_llm.family("qwen2", "Qwen2", config_to_switches)
