"""Qwen3: the shared decoder (decoder_llm.py) with an RMS norm over each head of the queries
and keys (`q_norm`, `k_norm`) before the rotation, `head_dim` 128 unless config.json says, no
biases (`attention_bias` true is refused: its o_proj bias has no place here), and Qwen2's
sliding-window declaration."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.qwen2 import window_switches

DEFAULTS = dict(
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    num_key_value_heads=32,
    head_dim=128,
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Qwen3 config.json."""
    if hf.get("attention_bias"):
        problems.append("attention_bias=True (only false is supported)")
    fields = decoder_llm.config_switches(hf, problems, DEFAULTS)
    return {**fields, **window_switches(hf, problems), "qk_norm": True}


QWEN3 = decoder_llm.family("qwen3", "Qwen3", config_to_switches)
