"""DistilBERT: BERT's post-LN encoder (model kind "encoder") without token types, its own
names (`q_lin`, `sa_layer_norm`, `lin1`, ...) and LayerNorm eps fixed at 1e-12;
`DistilBertModel` (no pooler) and `DistilBertForSequenceClassification` (`pre_classifier`,
ReLU, `classifier` on the first token). A sinusoidal position table (sinusoidal_pos_embds) is
stored as a weight like a learned one, and read as such."""

from __future__ import annotations

import re

from flax_transformer.hf.families.bert_layout import STORED_BUFFERS, head_of, num_labels
from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.hf.families.field_types import FieldType, integer, probability
from flax_transformer.spec.kinds import ENCODER

PREFIX = "distilbert."
HEADS = {
    "DistilBertModel": ("none", False),
    "DistilBertForSequenceClassification": ("sequence_relu", False),
}
# The weights of DistilBERT's classes that a class may not use (Family.other_class_keys): the
# masked LM head (distilbert-base-uncased is saved from DistilBertForMaskedLM), the
# classifiers, DistilBertForQuestionAnswering's qa_outputs.
OTHER_CLASS_KEYS = re.compile(
    r"(vocab_transform|vocab_layer_norm|vocab_projector|pre_classifier|classifier|qa_outputs)"
    r"\.(weight|bias)"
)
SIZES = ("vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings")


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a DistilBERT config.json."""
    head, pooler = head_of(hf, HEADS)
    dropout = hf.get("dropout", 0.1)
    classifier = hf.get("seq_classif_dropout", 0.2)
    if head != "none" and classifier != dropout:
        warnings.append(
            f"seq_classif_dropout={classifier} differs from dropout={dropout}: training uses "
            f"{dropout} for both"
        )
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=hf["dim"],
        num_heads=hf["n_heads"],
        num_encoder_layers=hf["n_layers"],
        num_decoder_layers=0,
        d_ff=hf["hidden_dim"],
        dropout_rate=dropout,
        attention_dropout_rate=hf.get("attention_dropout", 0.1),
        max_len=hf["max_position_embeddings"],
        layer_norm_eps=1e-12,
        positional="learned",
        embed_norm=True,
        pooler=pooler,
        head=head,
        num_labels=num_labels(hf),
        pad_id=hf.get("pad_token_id") or 0,
    )


def weight_renames() -> tuple[tuple[str, str], ...]:
    """DistilBERT's weight names (q_lin, sa_layer_norm, ...) -> this project's, in order."""
    layer, canon = PREFIX + "transformer.layer.{i}", "encoder.layers.{i}"
    rules = [
        (PREFIX + "embeddings.word_embeddings.weight", "src_embed.weight"),
        (PREFIX + "embeddings.position_embeddings.weight", "pos_embed.weight"),
        (PREFIX + "embeddings.LayerNorm.{p}", "src_embed_norm.{p}"),
        ("pre_classifier.{p}", "head.pre_classifier.{p}"),
        ("classifier.{p}", "head.classifier.{p}"),
    ]
    for hf_name, name in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
        rules.append((f"{layer}.attention.{hf_name}.{{p}}", f"{canon}.self_attn.{name}.{{p}}"))
    rules += [
        (f"{layer}.attention.out_lin.{{p}}", f"{canon}.self_attn.out.{{p}}"),
        (f"{layer}.sa_layer_norm.{{p}}", f"{canon}.norm1.{{p}}"),
        (f"{layer}.ffn.lin1.{{p}}", f"{canon}.ffn.linear1.{{p}}"),
        (f"{layer}.ffn.lin2.{{p}}", f"{canon}.ffn.linear2.{{p}}"),
        (f"{layer}.output_layer_norm.{{p}}", f"{canon}.norm2.{{p}}"),
    ]
    return tuple(rules)


DISTILBERT = Family(
    model_types=("distilbert",),
    kind=ENCODER,
    architectures=tuple(HEADS),
    required=SIZES,
    legacy_values=dict(is_decoder=False),
    default_activation="gelu",
    config_to_switches=config_to_switches,
    weight_renames=weight_renames(),
    prefix=PREFIX,
    tied_groups=lambda hf: [],
    ignored_keys=STORED_BUFFERS,
    other_class_keys=OTHER_CLASS_KEYS,
    field_types=dict(
        {name: integer() for name in SIZES},
        activation=FieldType("str"),
        dropout=probability(),
        attention_dropout=probability(),
        seq_classif_dropout=probability(),
        sinusoidal_pos_embds=FieldType("bool"),
    ),
    width_and_heads=(("dim", "n_heads"),),
    bare_architectures=("DistilBertModel",),
    activation_key="activation",
)
