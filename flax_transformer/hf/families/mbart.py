"""mBART: BART made pre-LN, with a LayerNorm after each stack; decoder inputs default to the
source with each row's last real token (its language code) moved to the front."""

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
    norm_first=True,
    final_norm=True,
    positional="learned",
    sinusoid_layout="interleaved",
    position_offset=2,
    separate_positions=True,
    embed_norm=True,
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of an mBART config.json (one shared embedding table, the
    mBART pre-LN switches); what cannot be expressed goes to `problems`."""
    return seq2seq_fields(hf, problems, warnings, share=True, switches=SWITCHES)


def shift_right(input_ids: np.ndarray, hf: HFConfig) -> np.ndarray:
    """transformers' mBART shift_tokens_right: each row's last non-pad token first."""
    last = (input_ids != hf.get("pad_token_id")).sum(axis=1) - 1
    first = input_ids[np.arange(len(input_ids)), last][:, None]
    return np.concatenate([first, input_ids[:, :-1]], axis=1)


MBART = Family(
    model_types=("mbart",),
    kind=SEQ2SEQ,
    architectures=("MBartForConditionalGeneration", "MBartModel"),
    required=REQUIRED,
    legacy_values=dict(
        normalize_before=True,
        normalize_embedding=True,
        add_final_layer_norm=True,
        static_position_embeddings=False,
        add_bias_logits=False,
        extra_pos_embeddings=2,
        is_decoder=False,
    ),
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=seq2seq_renames(learned_positions=True, stack_norms=True),
    prefix="model.",
    tied_groups=shared_tied_groups,
    ignored_keys=FAIRSEQ_VERSION_KEYS,
    final_logits_bias=True,
    shift_right=shift_right,
    field_types=seq2seq_field_types(optional=False),
    width_and_heads=WIDTH_AND_HEADS,
)
