"""BERT: a post-LN encoder (model kind "encoder") with word + learned position + token type
embeddings and a LayerNorm on them, exact gelu; `BertModel` (with its pooler: dense + tanh on
the first token), `BertForSequenceClassification` (the pooler, then `classifier`),
`BertForTokenClassification` (`classifier` on every token) and `BertForMaskedLM` (`cls.
predictions`: dense, hidden_act, LayerNorm, then the word embeddings as decoder plus a bias)."""

from __future__ import annotations

import re

from flax_transformer.hf.families.bert_layout import (
    ENCODER_FIELD_TYPES,
    ENCODER_LEGACY_VALUES,
    ENCODER_SIZES,
    STORED_BUFFERS,
    encoder_switches,
    encoder_weight_renames,
)
from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.spec.kinds import ENCODER

PREFIX = "bert."
WORDS = PREFIX + "embeddings.word_embeddings.weight"
# Each architecture's (config.head, pooler), the bare model first.
HEADS = {
    "BertModel": ("none", True),
    "BertForSequenceClassification": ("sequence_pooled", True),
    "BertForTokenClassification": ("token", False),
    "BertForMaskedLM": ("masked_lm", False),
}
HEAD_RULES = (
    ("classifier.{p}", "head.classifier.{p}"),
    ("cls.predictions.transform.dense.{p}", "head.dense.{p}"),
    ("cls.predictions.transform.LayerNorm.{p}", "head.norm.{p}"),
    ("cls.predictions.bias", "head.bias"),
)

# The weights of BERT's classes that a class may not use (Family.other_class_keys):
# BertForPreTraining's masked LM (cls.predictions) and next-sentence (cls.seq_relationship)
# heads, the pooler, the classifiers, BertForQuestionAnswering's qa_outputs.
OTHER_CLASS_KEYS = re.compile(
    r"cls\.predictions\.(transform\.(dense|LayerNorm)\.(weight|bias)|bias|decoder\.(weight|bias))"
    r"|cls\.seq_relationship\.(weight|bias)"
    r"|bert\.pooler\.dense\.(weight|bias)"
    r"|(classifier|qa_outputs)\.(weight|bias)"
)


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a BERT config.json (bert_encoder_switches)."""
    fields = encoder_switches(hf, HEADS, problems, warnings)
    return dict(fields, max_len=hf["max_position_embeddings"], pad_id=hf.get("pad_token_id", 0))


def tied_groups(hf: HFConfig) -> list[list[str]]:
    """The masked LM's decoder is the word embeddings, its bias the head's bias."""
    return [
        [WORDS, "cls.predictions.decoder.weight"],
        ["cls.predictions.bias", "cls.predictions.decoder.bias"],
    ]


BERT = Family(
    model_types=("bert",),
    kind=ENCODER,
    architectures=tuple(HEADS),
    required=ENCODER_SIZES,
    legacy_values=ENCODER_LEGACY_VALUES,
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=encoder_weight_renames(PREFIX, HEAD_RULES),
    prefix=PREFIX,
    tied_groups=tied_groups,
    ignored_keys=STORED_BUFFERS,
    other_class_keys=OTHER_CLASS_KEYS,
    field_types=ENCODER_FIELD_TYPES,
    width_and_heads=(("hidden_size", "num_attention_heads"),),
    bare_architectures=("BertModel",),
    activation_key="hidden_act",
)
