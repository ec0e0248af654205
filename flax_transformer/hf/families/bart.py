"""BART: post-LN encoder-decoder, gelu, learned positions read at index + 2, a LayerNorm after
the embeddings; decoder inputs default to the source shifted right after
decoder_start_token_id."""

from __future__ import annotations

import numpy as np

from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.hf.families.seq2seq import (
    FAIRSEQ_VERSION_KEYS,
    REQUIRED,
    WIDTH_AND_HEADS,
    seq2seq_field_types,
    seq2seq_fields,
    seq2seq_renames,
    shared_tied_groups,
)
from flax_transformer.spec.kinds import SEQ2SEQ

SWITCHES = dict(
    norm_first=False,
    final_norm=False,
    positional="learned",
    sinusoid_layout="interleaved",
    position_offset=2,
    separate_positions=True,
    embed_norm=True,
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a BART config.json (one shared embedding table, the BART
    switches); what cannot be expressed goes to `problems`, training-only differences to
    `warnings`."""
    return seq2seq_fields(hf, problems, warnings, share=True, switches=SWITCHES)


def shift_right(input_ids: np.ndarray, hf: HFConfig) -> np.ndarray:
    """transformers' shift_tokens_right: decoder_start_token_id, then the source without its
    last token; -100 (a loss label) becomes the pad id."""
    start = hf.get("decoder_start_token_id")
    shifted = np.concatenate([np.full_like(input_ids[:, :1], start), input_ids[:, :-1]], 1)
    return np.where(shifted == -100, hf.get("pad_token_id"), shifted)


BART = Family(
    model_types=("bart",),
    kind=SEQ2SEQ,
    architectures=("BartForConditionalGeneration", "BartModel"),
    required=REQUIRED,
    legacy_values=dict(
        normalize_before=False,
        normalize_embedding=True,
        add_final_layer_norm=False,
        static_position_embeddings=False,
        add_bias_logits=False,
        extra_pos_embeddings=2,
        is_decoder=False,
    ),
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=seq2seq_renames(learned_positions=True, stack_norms=False),
    prefix="model.",
    tied_groups=shared_tied_groups,
    ignored_keys=FAIRSEQ_VERSION_KEYS,
    final_logits_bias=True,
    shift_right=shift_right,
    field_types=seq2seq_field_types(optional=True),
    width_and_heads=WIDTH_AND_HEADS,
)
