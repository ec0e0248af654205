"""Mistral: the shared decoder (decoder_llm.py), no biases, a sliding window (`sliding_window`,
4096 when config.json names none, null for none) in every layer's attention."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig

DEFAULTS = dict(
    max_position_embeddings=4096 * 32,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    num_key_value_heads=8,
    sliding_window=4096,
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Mistral config.json."""
    if hf.get("layer_types") is not None:
        problems.append("layer_types (Mistral with per-layer attention types: Ministral's)")
    fields = decoder_llm.config_switches(hf, problems, DEFAULTS)
    fields["sliding_window"] = {**DEFAULTS, **hf}["sliding_window"]
    return fields


MISTRAL = decoder_llm.family("mistral", "Mistral", config_to_switches)
