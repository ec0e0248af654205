"""Marian (the opus-mt translation models): the paper's post-LN encoder-decoder, swish,
[sin half | cos half] positions from 0 (never trained, rebuilt at load), one embedding table
unless `share_encoder_decoder_embeddings` is false; the decoder starts with the pad id."""

from __future__ import annotations

import re

from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.hf.families.field_types import boolean, integer
from flax_transformer.hf.families.seq2seq import (
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
    positional="sinusoidal",
    sinusoid_layout="halves",
    position_offset=0,
    separate_positions=False,
    embed_norm=False,
)
# Older checkpoints stored the constant sinusoid tables.
STORED_POSITIONS = re.compile(r"^model\.(encoder|decoder)\.embed_positions\.weight$")


def _shares_embeddings(hf: HFConfig) -> bool:
    return hf.get("share_encoder_decoder_embeddings", True)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a Marian config.json (one shared embedding table unless
    share_encoder_decoder_embeddings is false); what cannot be expressed goes to `problems`."""
    share = _shares_embeddings(hf)
    return seq2seq_fields(hf, problems, warnings, share=share, switches=SWITCHES)


def tied_groups(hf: HFConfig) -> list[list[str]]:
    """HF keys that hold one tensor: the decoder table and lm_head when the embeddings are not
    shared, else the shared groups."""
    if not _shares_embeddings(hf):  # the head tied to the decoder's own table
        return [["model.decoder.embed_tokens.weight", "lm_head.weight"]]
    return shared_tied_groups(hf)


def target_vocab(hf: HFConfig) -> int:
    """The decoder's vocabulary size: decoder_vocab_size when the embeddings are not shared (and
    it is set), else vocab_size."""
    if not _shares_embeddings(hf):
        return hf.get("decoder_vocab_size") or hf["vocab_size"]
    return hf["vocab_size"]


MARIAN = Family(
    model_types=("marian",),
    kind=SEQ2SEQ,
    architectures=("MarianMTModel", "MarianModel"),
    required=REQUIRED,
    legacy_values=dict(
        normalize_before=False,
        normalize_embedding=False,
        add_final_layer_norm=False,
        static_position_embeddings=True,
        add_bias_logits=False,
        is_decoder=False,
    ),
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=seq2seq_renames(learned_positions=False, stack_norms=False),
    prefix="model.",
    tied_groups=tied_groups,
    final_logits_bias=True,
    target_vocab=target_vocab,
    stored_sinusoid_keys=STORED_POSITIONS,
    shift_right=None,  # transformers builds no decoder inputs for Marian
    field_types=dict(
        seq2seq_field_types(optional=False),
        decoder_vocab_size=integer(optional=True),
        share_encoder_decoder_embeddings=boolean(),
    ),
    width_and_heads=WIDTH_AND_HEADS,
)
