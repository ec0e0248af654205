"""What BERT and RoBERTa (XLM-RoBERTa) share: the weight names of the encoder, the config
options read, and how a family's architectures choose the pooler and the head (spec.config
ENCODER_HEADS). bert.py and roberta.py are each one `Family` built from these."""

from __future__ import annotations

import re
from collections.abc import Mapping

from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.field_types import FieldType, integer, number, probability

ENCODER_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
ENCODER_FIELD_TYPES = dict(
    {name: integer() for name in ENCODER_SIZES},
    type_vocab_size=integer(minimum=0),
    hidden_act=FieldType("str"),
    hidden_dropout_prob=probability(),
    attention_probs_dropout_prob=probability(),
    classifier_dropout=probability(optional=True),
    layer_norm_eps=number(min=0, min_exclusive=True),
)
# position_ids, a persistent buffer in older transformers versions (bert-base-uncased's
# pytorch_model.bin holds one), a constant transformers 5 ignores without a word.
STORED_BUFFERS = re.compile(r"(^|\.)embeddings\.position_ids$")
ENCODER_LEGACY_VALUES = dict(
    is_decoder=False, add_cross_attention=False, position_embedding_type="absolute"
)


def head_of(hf: HFConfig, heads: Mapping[str, tuple[str, bool]]) -> tuple[str, bool]:
    """(config.head, pooler) of config.json's first architecture the family knows (its bare
    model when none is named)."""
    for name in hf.get("architectures") or []:
        if name in heads:
            return heads[name]
    return next(iter(heads.values()))


def num_labels(hf: HFConfig) -> int:
    """The classifier's outputs: id2label's size (what transformers derives num_labels from),
    else num_labels, else 2 (transformers' default)."""
    labels = hf.get("id2label")
    if isinstance(labels, Mapping) and labels:
        return len(labels)
    return hf.get("num_labels") or 2


def encoder_switches(
    hf: HFConfig, heads: Mapping[str, tuple[str, bool]], problems: list[str], warnings: list[str]
) -> dict:
    """The TransformerConfig fields BERT and RoBERTa share: post-LN blocks, learned positions,
    token types, an embedding LayerNorm, the pooler and head of the architecture."""
    head, pooler = head_of(hf, heads)
    if head == "masked_lm" and hf.get("tie_word_embeddings") is False:
        problems.append(
            "tie_word_embeddings=False (the masked LM's decoder is read as tied to the word "
            "embeddings)"
        )
    hidden, attention = (
        hf.get("hidden_dropout_prob", 0.1),
        hf.get("attention_probs_dropout_prob", 0.1),
    )
    classifier = hf.get("classifier_dropout")
    if classifier is not None and classifier != hidden:
        warnings.append(
            f"classifier_dropout={classifier} differs from hidden_dropout_prob={hidden}: "
            f"training uses {hidden} for both"
        )
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_encoder_layers=hf["num_hidden_layers"],
        num_decoder_layers=0,
        d_ff=hf["intermediate_size"],
        dropout_rate=hidden,
        attention_dropout_rate=attention,
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        positional="learned",
        embed_norm=True,
        type_vocab_size=hf.get("type_vocab_size", 2),
        pooler=pooler,
        head=head,
        num_labels=num_labels(hf),
    )


def encoder_weight_renames(prefix: str, head_rules) -> tuple[tuple[str, str], ...]:
    """(HF template, canonical template) pairs of a BERT-layout encoder under `prefix`
    ("bert." / "roberta."), then the head's `head_rules`."""
    emb, layer = f"{prefix}embeddings", f"{prefix}encoder.layer.{{i}}"
    canon = "encoder.layers.{i}"
    rules = [
        (f"{emb}.word_embeddings.weight", "src_embed.weight"),
        (f"{emb}.position_embeddings.weight", "pos_embed.weight"),
        (f"{emb}.token_type_embeddings.weight", "type_embed.weight"),
        (f"{emb}.LayerNorm.{{p}}", "src_embed_norm.{p}"),
        (f"{prefix}pooler.dense.{{p}}", "pooler.dense.{p}"),
    ]
    for hf_name, name in (("query", "query"), ("key", "key"), ("value", "value")):
        rules.append((f"{layer}.attention.self.{hf_name}.{{p}}", f"{canon}.self_attn.{name}.{{p}}"))
    rules += [
        (f"{layer}.attention.output.dense.{{p}}", f"{canon}.self_attn.out.{{p}}"),
        (f"{layer}.attention.output.LayerNorm.{{p}}", f"{canon}.norm1.{{p}}"),
        (f"{layer}.intermediate.dense.{{p}}", f"{canon}.ffn.linear1.{{p}}"),
        (f"{layer}.output.dense.{{p}}", f"{canon}.ffn.linear2.{{p}}"),
        (f"{layer}.output.LayerNorm.{{p}}", f"{canon}.norm2.{{p}}"),
    ]
    return tuple(rules) + tuple(head_rules)
