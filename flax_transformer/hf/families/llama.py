"""Llama (2, 3, 3.1, 3.2, ...): the shared decoder (decoder_llm.py) with no biases (config
`attention_bias` / `mlp_bias` true are refused: their output and feed-forward biases have no
place here), full attention in every layer, rotary scaling by rope_parameters (Llama 3.1+:
`llama3`)."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig

DEFAULTS = dict(max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Llama config.json."""
    for option in ("attention_bias", "mlp_bias"):
        if hf.get(option):
            problems.append(f"{option}=True (only false is supported)")
    return decoder_llm.config_switches(hf, problems, DEFAULTS)


LLAMA = decoder_llm.family("llama", "Llama", config_to_switches)
