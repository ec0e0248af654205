"""RoBERTa and XLM-RoBERTa: BERT's encoder and names (bert_py) under `roberta.`, with
positions that skip padding (the k-th real token reads row pad_token_id + k of the table, a pad
token row pad_token_id), layer_norm_eps usually 1e-5; `*Model` (with the pooler),
`*ForSequenceClassification` (`classifier.dense`, tanh, `classifier.out_proj` on the first
token; no pooler), `*ForTokenClassification` and `*ForMaskedLM` (`lm_head`: dense, exact gelu,
`layer_norm`, the word embeddings as decoder plus `lm_head.bias`)."""

from __future__ import annotations

import re

from flax_transformer.hf.families.bert_layout import (
    ENCODER_FIELD_TYPES,
    ENCODER_LEGACY_VALUES,
    ENCODER_SIZES,
    STORED_BUFFERS,
    encoder_switches,
    encoder_weight_renames,
    head_of,
)
from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.spec.kinds import ENCODER

PREFIX = "roberta."
WORDS = PREFIX + "embeddings.word_embeddings.weight"
KINDS = {
    "Model": ("none", True),
    "ForSequenceClassification": ("sequence_tanh", False),
    "ForTokenClassification": ("token", False),
    "ForMaskedLM": ("masked_lm", False),
}
# Each architecture's (config.head, pooler), the bare model first.
HEADS = {
    f"{name}{kind}": value for name in ("Roberta", "XLMRoberta") for kind, value in KINDS.items()
}
HEAD_RULES = (
    ("lm_head.dense.{p}", "head.dense.{p}"),
    ("lm_head.layer_norm.{p}", "head.norm.{p}"),
    ("lm_head.bias", "head.bias"),
)
# The sequence head's `classifier` is a module of two layers, the token head's one layer.
SEQUENCE_RULES = (
    ("classifier.dense.{p}", "head.pre_classifier.{p}"),
    ("classifier.out_proj.{p}", "head.classifier.{p}"),
)
TOKEN_RULES = (("classifier.{p}", "head.classifier.{p}"),)
# The weights of RoBERTa's classes that a class may not use (Family.other_class_keys): the
# masked LM head (roberta-base is saved from RobertaForMaskedLM), the pooler, the classifiers,
# *ForQuestionAnswering's qa_outputs.
OTHER_CLASS_KEYS = re.compile(
    r"lm_head\.((dense|layer_norm|decoder)\.(weight|bias)|bias)"
    r"|roberta\.pooler\.dense\.(weight|bias)"
    r"|classifier\.((dense|out_proj)\.)?(weight|bias)"
    r"|qa_outputs\.(weight|bias)"
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a RoBERTa / XLM-RoBERTa config.json: BERT's
    (bert_encoder_switches), positions after pad_token_id + 1 that skip padding."""
    fields = encoder_switches(hf, HEADS, problems, warnings)
    pad = hf.get("pad_token_id", 1)
    if pad is None:
        problems.append("pad_token_id=None (RoBERTa's positions are counted from it)")
        pad = 1
    if fields["head"] == "masked_lm" and hf.get("hidden_act", "gelu") != "gelu":
        problems.append(
            f"hidden_act={hf['hidden_act']!r} with a masked LM head (RoBERTa's head applies "
            "gelu whatever hidden_act says; only 'gelu' is supported)"
        )
    rows = hf["max_position_embeddings"]
    if rows < pad + 2:
        problems.append(
            f"max_position_embeddings={rows} leaves no position after pad_token_id={pad}"
        )
    return dict(
        fields,
        max_len=max(rows - pad - 1, 1),
        position_offset=pad + 1,
        positions_skip_padding=True,
        pad_id=pad,
    )


def weight_renames(hf: HFConfig) -> tuple[tuple[str, str], ...]:
    """The encoder's names, then the head's: `classifier` is two layers in the sequence head."""
    head, _ = head_of(hf, HEADS)
    classifier = SEQUENCE_RULES if head == "sequence_tanh" else TOKEN_RULES
    return encoder_weight_renames(PREFIX, HEAD_RULES + classifier)


def tied_groups(hf: HFConfig) -> list[list[str]]:
    """The masked LM's decoder is the word embeddings, its bias lm_head.bias."""
    return [[WORDS, "lm_head.decoder.weight"], ["lm_head.bias", "lm_head.decoder.bias"]]


ROBERTA = Family(
    model_types=("roberta", "xlm-roberta"),
    kind=ENCODER,
    architectures=tuple(HEADS),
    required=ENCODER_SIZES,
    legacy_values=ENCODER_LEGACY_VALUES,
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=weight_renames,
    prefix=PREFIX,
    tied_groups=tied_groups,
    ignored_keys=STORED_BUFFERS,
    other_class_keys=OTHER_CLASS_KEYS,
    field_types=ENCODER_FIELD_TYPES,
    width_and_heads=(("hidden_size", "num_attention_heads"),),
    bare_architectures=("RobertaModel", "XLMRobertaModel"),
    activation_key="hidden_act",
)
