"""T5 (v1.0, and v1.1 / Flan-T5), mT5 and UMT5, full models and bare encoders.

Pre-LN with an RMS norm (no mean, no bias) and a final norm on each stack, no absolute
positions but a relative position bias on every self-attention (computed in layer 0 and shared
by the stack's layers; UMT5: one per layer), unscaled attention logits, no biases, a `relu` or
gated (`wi_0` activated, `wi_1` linear) feed-forward; one embedding table (`shared`); decoding
starts from decoder_start_token_id (the pad id). The head: tied to `shared` unless the file holds
an `lm_head.weight` of its own (v1.1); the decoder output scaled by d_model ** -0.5 before it
when transformers scales (T5 and UMT5: `scale_decoder_outputs`, else `tie_word_embeddings`; mT5
never). `T5EncoderModel` and its mT5 / UMT5 twins are the model kind "encoder".

transformers 5 writes `tie_word_embeddings: true` for every T5 and records v1.1's unscaled
output as `scale_decoder_outputs: false`; transformers 4 (and most Hub files) wrote
`tie_word_embeddings: false` and no `scale_decoder_outputs` for v1.1. resolve_config reads both
as transformers 5 does, and pins the result (both options, explicit) into the config the model
keeps, so hf.save writes a config.json both versions read the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer.hf.families.family import Family, HFConfig
from flax_transformer.hf.families.field_types import (
    FieldType,
    boolean,
    integer,
    number,
    probability,
)
from flax_transformer.spec.kinds import ENCODER, SEQ2SEQ

MODEL_TYPES = ("t5", "mt5", "umt5")
# transformers' config classes' defaults (T5Config; MT5Config and UMT5Config differ in these).
DEFAULTS = dict(
    vocab_size=32128,
    d_model=512,
    d_kv=64,
    d_ff=2048,
    num_layers=6,
    num_heads=8,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_rate=0.1,
    layer_norm_epsilon=1e-6,
    feed_forward_proj="relu",
    pad_token_id=0,
    eos_token_id=1,
)
MULTILINGUAL_DEFAULTS = dict(
    vocab_size=250112,
    d_ff=1024,
    num_layers=8,
    num_heads=6,
    feed_forward_proj="gated-gelu",
    decoder_start_token_id=0,
)
# No absolute positions: the longest input is a choice; transformers' own n_positions, 512.
DEFAULT_MAX_LEN = 512
_ATTENTION = {"q": "query", "k": "key", "v": "value", "o": "out"}
_HEAD = "lm_head.weight"
_SHARED = "shared.weight"


def defaults(model_type: str) -> dict[str, Any]:
    """The config class's defaults for the options this family reads."""
    if model_type == "t5":
        return dict(DEFAULTS)
    return {**DEFAULTS, **MULTILINGUAL_DEFAULTS}


def feed_forward(hf: HFConfig) -> tuple[str, bool]:
    """(transformers' activation name, gated) as T5Config derives them from feed_forward_proj
    ("relu", "gated-gelu" -> gelu_new), unless config.json states dense_act_fn / is_gated_act
    (which transformers then keeps)."""
    proj = hf.get("feed_forward_proj", defaults(hf["model_type"])["feed_forward_proj"])
    parts = proj.split("-") if isinstance(proj, str) else ["?"]
    activation = "gelu_new" if proj == "gated-gelu" else parts[-1]
    activation = hf.get("dense_act_fn") or activation
    return activation, hf.get("is_gated_act", parts[0] == "gated")


def scales_output(hf: HFConfig) -> bool:
    """Whether transformers multiplies the decoder output by d_model ** -0.5 before the head:
    mT5 never; T5 and UMT5 by scale_decoder_outputs when given, else unless
    tie_word_embeddings is false (transformers 4's v1.1 files)."""
    if hf["model_type"] == "mt5":
        return False
    if hf.get("scale_decoder_outputs") is not None:
        return hf["scale_decoder_outputs"]
    return hf.get("tie_word_embeddings") is not False


def resolve_config(hf: HFConfig, state: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """config.json as transformers 5 reads it with these weights: the config class's defaults
    where an option is missing, the decoder output scaling pinned (scale_decoder_outputs; not
    for mT5), and tie_word_embeddings false exactly when the file holds an lm_head.weight of
    its own (present and not equal to shared.weight: transformers then unties the head)."""
    resolved = {**defaults(hf["model_type"]), **hf}
    if hf["model_type"] != "mt5":
        resolved["scale_decoder_outputs"] = scales_output(hf)
    head, shared = state.get(_HEAD), state.get(_SHARED)
    own_head = head is not None and not (
        shared is not None and head.shape == shared.shape and np.array_equal(head, shared)
    )
    resolved["tie_word_embeddings"] = not own_head
    return resolved


def config_to_switches(hf: HFConfig, problems: list[str], warnings: list[str]) -> dict:
    """The TransformerConfig fields of a T5 / mT5 / UMT5 config.json; what cannot be expressed
    goes to `problems` (naming the option), training-only differences to `warnings`."""
    hf = {**defaults(hf["model_type"]), **hf}
    encoder = any(a in ENCODER_ARCHITECTURES for a in hf.get("architectures") or [])
    proj = hf["feed_forward_proj"]
    parts = proj.split("-")
    if (len(parts) > 1 and parts[0] != "gated") or len(parts) > 2:
        problems.append(
            f"feed_forward_proj={proj!r} (transformers reads `ACT` or `gated-ACT`, e.g. 'relu' "
            "or 'gated-gelu')"
        )
    heads, head_dim, d_model = hf["num_heads"], hf["d_kv"], hf["d_model"]
    decoder_layers = hf.get("num_decoder_layers")
    if decoder_layers is None:
        decoder_layers = hf["num_layers"]
    if hf["dropout_rate"]:
        warnings.append(
            f"dropout_rate={hf['dropout_rate']}: T5's dropout after each stack's final norm is "
            "not applied when training"
        )
    _, gated = feed_forward(hf)
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=d_model,
        num_heads=heads,
        attention_head_dim=None if heads * head_dim == d_model else head_dim,
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=0 if encoder else decoder_layers,
        d_ff=hf["d_ff"],
        dropout_rate=hf["dropout_rate"],
        attention_dropout_rate=hf["dropout_rate"],
        max_len=hf.get("n_positions") or DEFAULT_MAX_LEN,
        layer_norm_eps=hf["layer_norm_epsilon"],
        norm_first=True,
        final_norm=True,
        norm_type="rms",
        positional="none",
        relative_attention_buckets=hf["relative_attention_num_buckets"],
        relative_attention_max_distance=hf["relative_attention_max_distance"],
        relative_attention_per_layer=hf["model_type"] == "umt5",
        scale_attention_logits=False,
        use_bias=False,
        gated_ffn=gated,
        share_embeddings=True,
        tie_output=hf.get("tie_word_embeddings") is not False,
        scale_decoder_output=scales_output(hf),
        pad_id=hf["pad_token_id"],
        decoder_start_id=hf.get("decoder_start_token_id"),
    )


def weight_renames(hf: HFConfig) -> tuple[tuple[str, str], ...]:
    """(HF template, canonical template) pairs: `wi` or `wi_0` / `wi_1` as the feed-forward is
    plain or gated; the relative bias of block 0 shared by the stack (T5, mT5) or one per block
    (UMT5)."""
    _, gated = feed_forward({**defaults(hf.get("model_type", "t5")), **hf})
    per_layer = hf.get("model_type") == "umt5"
    rules = [(_SHARED, "shared_embed.weight"), (_HEAD, "lm_head.weight")]
    for stack in ("encoder", "decoder"):
        block, layer = f"{stack}.block.{{i}}.layer", f"{stack}.layers.{{i}}"
        bias = f"{block}.0.SelfAttention.relative_attention_bias.weight"
        if per_layer:
            rules.append((bias, f"{layer}.relative_bias.weight"))
        else:
            rules.append((bias.replace("{i}", "0"), f"{stack}.relative_bias.weight"))
        sublayers = [("0.SelfAttention", "self_attn", "norm1")]
        if stack == "decoder":
            sublayers.append(("1.EncDecAttention", "cross_attn", "norm2"))
        for hf_name, attention, norm in sublayers:
            for hf_proj, proj in _ATTENTION.items():
                rules.append(
                    (f"{block}.{hf_name}.{hf_proj}.weight", f"{layer}.{attention}.{proj}.weight")
                )
            rules.append((f"{block}.{hf_name[0]}.layer_norm.weight", f"{layer}.{norm}.weight"))
        ff = len(sublayers)  # the feed-forward sublayer's index: 1 (encoder) or 2 (decoder)
        ffn = f"{block}.{ff}.DenseReluDense"
        if gated:
            rules.append((f"{ffn}.wi_0.weight", f"{layer}.ffn.linear1.weight"))
            rules.append((f"{ffn}.wi_1.weight", f"{layer}.ffn.linear3.weight"))
        else:
            rules.append((f"{ffn}.wi.weight", f"{layer}.ffn.linear1.weight"))
        rules.append((f"{ffn}.wo.weight", f"{layer}.ffn.linear2.weight"))
        rules.append((f"{block}.{ff}.layer_norm.weight", f"{layer}.norm{ff + 1}.weight"))
        rules.append((f"{stack}.final_layer_norm.weight", f"{stack}.norm.weight"))
    return tuple(rules)


def tied_groups(hf: HFConfig) -> list[list[str]]:
    """The stacks' embed_tokens are always `shared` (transformers 5 ties them whatever the
    config); the head too unless it is untied (resolve_config)."""
    group = [_SHARED, "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    if hf.get("tie_word_embeddings") is not False:
        group.append(_HEAD)
    return [group]


def shift_right(input_ids: np.ndarray, hf: HFConfig) -> np.ndarray:
    """transformers' T5 _shift_right: decoder_start_token_id, then the input without its last
    token; -100 (a loss label) becomes the pad id."""
    start = hf.get("decoder_start_token_id")
    if start is None:
        raise ValueError(
            "config.json has no decoder_start_token_id (T5 starts decoding with it, usually the "
            "pad id 0): give decoder_input_ids"
        )
    shifted = np.concatenate([np.full_like(input_ids[:, :1], start), input_ids[:, :-1]], 1)
    return np.where(shifted == -100, hf.get("pad_token_id", 0), shifted)


def read_activation(hf: HFConfig):
    """transformers' activation name: dense_act_fn, else from feed_forward_proj."""
    return feed_forward({**defaults(hf["model_type"]), **hf})[0]


SEQ2SEQ_ARCHITECTURES = tuple(f"{name}ForConditionalGeneration" for name in ("T5", "MT5", "UMT5"))
ENCODER_ARCHITECTURES = tuple(f"{name}EncoderModel" for name in ("T5", "MT5", "UMT5"))
SIZES = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")

T5 = Family(
    model_types=MODEL_TYPES,
    kind=SEQ2SEQ,
    architectures=SEQ2SEQ_ARCHITECTURES + ENCODER_ARCHITECTURES,
    required=(),  # transformers' defaults fill what is missing (resolve_config)
    legacy_values=dict(is_decoder=False),
    default_activation="relu",
    config_to_switches=config_to_switches,
    weight_renames=weight_renames,
    prefix="",
    tied_groups=tied_groups,
    # A tensor older checkpoints saved, which transformers ignores.
    ignored_keys=re.compile(
        r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$"
    ),
    shift_right=shift_right,
    max_positions_key="n_positions",
    field_types=dict(
        {name: integer() for name in SIZES},
        num_decoder_layers=integer(minimum=0, optional=True),
        relative_attention_num_buckets=integer(),
        relative_attention_max_distance=integer(),
        dropout_rate=probability(),
        layer_norm_epsilon=number(min=0, min_exclusive=True),
        feed_forward_proj=FieldType("str"),
        dense_act_fn=FieldType("str"),
        is_gated_act=boolean(),
        scale_decoder_outputs=boolean(optional=True),
        n_positions=integer(optional=True),
    ),
    architecture_kinds={name: ENCODER for name in ENCODER_ARCHITECTURES},
    ties_only_when_tied=False,
    resolve_config=resolve_config,
    activation_key="dense_act_fn",
    read_activation=read_activation,
)
