"""What the encoder-decoder families (Marian, BART, mBART) share: transformers wrote them
from one template (modeling_bart.py), so their configs and weight names differ only in a few
switches, which each family module states."""

from __future__ import annotations

import re
from typing import Any

from flax_transformer.hf.families.family import HFConfig
from flax_transformer.hf.families.field_types import (
    FieldType,
    boolean,
    integer,
    probability,
)

REQUIRED = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "max_position_embeddings",
    "pad_token_id",
)
WIDTH_AND_HEADS = (
    ("d_model", "encoder_attention_heads"),
    ("d_model", "decoder_attention_heads"),
)
FAIRSEQ_VERSION_KEYS = re.compile(r"^model\.(encoder|decoder)\.version$")
_ATTENTION = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "out"}


def seq2seq_field_types(optional: bool) -> dict[str, FieldType]:
    """The types of the fields seq2seq_fields reads, as the family's transformers config class
    declares them; `optional`: the sizes and switches may be null (BartConfig's `int | None`)."""
    return {
        "vocab_size": integer(),
        "max_position_embeddings": integer(),
        **{
            name: integer(optional=optional)
            for name in (
                "d_model",
                "encoder_layers",
                "decoder_layers",
                "encoder_attention_heads",
                "decoder_attention_heads",
                "encoder_ffn_dim",
                "decoder_ffn_dim",
            )
        },
        "encoder_layerdrop": probability(optional),
        "decoder_layerdrop": probability(optional),
        "dropout": probability(optional),
        "attention_dropout": probability(optional),
        "activation_dropout": probability(optional),
        "scale_embedding": boolean(optional),
    }


def seq2seq_renames(learned_positions: bool, stack_norms: bool) -> tuple[tuple[str, str], ...]:
    """(HF template, canonical template) pairs of an encoder-decoder family.

    learned_positions: `embed_positions` tables and an embedding LayerNorm (BART, mBART);
    stack_norms: a LayerNorm after each stack (pre-LN mBART)."""
    rules = [
        ("model.shared.weight", "shared_embed.weight"),
        ("model.encoder.embed_tokens.weight", "src_embed.weight"),
        ("model.decoder.embed_tokens.weight", "tgt_embed.weight"),
        ("lm_head.weight", "lm_head.weight"),
    ]
    for stack, norms in (
        ("encoder", {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}),
        (
            "decoder",
            {
                "self_attn_layer_norm": "norm1",
                "encoder_attn_layer_norm": "norm2",
                "final_layer_norm": "norm3",
            },
        ),
    ):
        hf_layer, layer = f"model.{stack}.layers.{{i}}", f"{stack}.layers.{{i}}"
        attentions = {"self_attn": "self_attn"}
        if stack == "decoder":
            attentions["encoder_attn"] = "cross_attn"
        for hf_attn, attn in attentions.items():
            for hf_proj, proj in _ATTENTION.items():
                rules.append(
                    (f"{hf_layer}.{hf_attn}.{hf_proj}.{{p}}", f"{layer}.{attn}.{proj}.{{p}}")
                )
        for hf_norm, norm in norms.items():
            rules.append((f"{hf_layer}.{hf_norm}.{{p}}", f"{layer}.{norm}.{{p}}"))
        rules.append((f"{hf_layer}.fc1.{{p}}", f"{layer}.ffn.linear1.{{p}}"))
        rules.append((f"{hf_layer}.fc2.{{p}}", f"{layer}.ffn.linear2.{{p}}"))
        side = "src" if stack == "encoder" else "tgt"
        if learned_positions:
            rules.append((f"model.{stack}.embed_positions.weight", f"{side}_pos_embed.weight"))
            rules.append((f"model.{stack}.layernorm_embedding.{{p}}", f"{side}_embed_norm.{{p}}"))
        if stack_norms:
            rules.append((f"model.{stack}.layer_norm.{{p}}", f"{stack}.norm.{{p}}"))
    return tuple(rules)


def shared_tied_groups(hf_config: HFConfig) -> list[list[str]]:
    """Both embeddings and the head tied to `model.shared` (transformers 5)."""
    return [
        [
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        ]
    ]


def seq2seq_fields(
    hf: HFConfig, problems: list[str], warnings: list[str], *, share: bool, switches: dict
) -> dict[str, Any]:
    """TransformerConfig fields of an encoder-decoder config; `share`: one embedding table for
    both sides; `switches`: the family's fixed architecture fields (positions, norms)."""
    for encoder_name, decoder_name in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(encoder_name) != hf.get(decoder_name):
            problems.append(
                f"{encoder_name}={hf.get(encoder_name)!r} != {decoder_name}="
                f"{hf.get(decoder_name)!r} (one value for both stacks)"
            )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(name):
            warnings.append(f"{name}={hf[name]} is not applied when training (no layer drop)")
    tie = hf.get("tie_word_embeddings", True)
    if share and not tie:
        problems.append(
            "tie_word_embeddings=False with shared embeddings (transformers then keeps four "
            "separate tables, one of them unused)"
        )
    vocab = hf["vocab_size"]
    return dict(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab if share else hf.get("decoder_vocab_size") or vocab,
        d_model=hf["d_model"],
        num_heads=hf["encoder_attention_heads"],
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        d_ff=hf["encoder_ffn_dim"],
        dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        activation_dropout_rate=hf.get("activation_dropout", 0.0),
        max_len=hf["max_position_embeddings"],
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        share_embeddings=share,
        tie_output=tie,
        final_logits_bias=True,
        pad_id=hf["pad_token_id"],
        decoder_start_id=hf.get("decoder_start_token_id"),
        **switches,
    )
