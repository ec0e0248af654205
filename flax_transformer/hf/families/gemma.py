"""Gemma (1): the shared decoder (decoder_llm.py) with RMS norms multiplying by 1 + weight
(the weights stored as offsets), the embedding scaled by sqrt(hidden_size) in the model's
dtype, a GeGLU feed-forward (the tanh GELU: `gelu_pytorch_tanh`; config.json's legacy "gelu"
means it too, as transformers reads it), a tied head and `head_dim` 256 unless config.json
says. What Gemma 2 and 3 share with it is here too (`gemma_switches`)."""

from __future__ import annotations

import flax_transformer.hf.families.decoder_llm as decoder_llm
from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.field_types import FieldType, number

DEFAULTS = dict(
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    num_key_value_heads=16,
    head_dim=256,
    pad_token_id=0,
)
TANH_GELU = "gelu_pytorch_tanh"


def gemma_switches(hf: HFConfig, problems: list[str], defaults: dict) -> dict:
    """The TransformerConfig fields every Gemma shares: the decoder's, with offset norms and
    the scaled embedding."""
    for option in ("attention_bias", "use_bidirectional_attention"):
        if hf.get(option):
            problems.append(f"{option}=True (only false is supported)")
    fields = decoder_llm.config_switches(hf, problems, defaults)
    return {**fields, "norm_weight_offset": True, "scale_embeddings": True}


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Gemma config.json."""
    return gemma_switches(hf, problems, DEFAULTS)


def read_hidden_act(hf: HFConfig):
    """transformers' activation of a Gemma config.json: hidden_act, whose "gelu" GemmaConfig
    reads as the tanh GELU (the official releases' legacy value)."""
    activation = hf.get("hidden_act", TANH_GELU)
    return TANH_GELU if activation == "gelu" else activation


FIELD_TYPES = dict(
    hidden_activation=FieldType("str", optional=True),
    query_pre_attn_scalar=number(min=0, min_exclusive=True),
    final_logit_softcapping=number(min=0, min_exclusive=True, optional=True),
    attn_logit_softcapping=number(min=0, min_exclusive=True, optional=True),
)

GEMMA = decoder_llm.family(
    "gemma",
    "Gemma",
    config_to_switches,
    FIELD_TYPES,
    default_activation=TANH_GELU,
    read_activation=read_hidden_act,
)
