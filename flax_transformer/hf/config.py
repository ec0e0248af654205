"""A Hugging Face config.json (marian, bart, mbart, gpt2) as this project's TransformerConfig.

numpy-free and JAX-free: plain dict work. Every option the model cannot express is collected and
raised in one UnsupportedConfigError; options that only change training (layer drop, dropout
values with no place here) are returned as warnings. See docs/hf.md for the mapping.
"""

from __future__ import annotations

from typing import Any

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import LM, SEQ2SEQ

SEQ2SEQ_TYPES = ("marian", "bart", "mbart")
MODEL_TYPES = (*SEQ2SEQ_TYPES, "gpt2")

# transformers' ACT2FN names -> ours ("gelu" there is the exact erf GELU, as here).
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "silu",
    "silu": "silu",
}

# The architecture classes whose weights this project maps (config.json "architectures").
ARCHITECTURES = {
    "marian": ("MarianMTModel", "MarianModel"),
    "bart": ("BartForConditionalGeneration", "BartModel"),
    "mbart": ("MBartForConditionalGeneration", "MBartModel"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Model"),
}

# Options with one supported value. Most are from older transformers versions, still found in
# config.json files (every opus-mt model has them) and ignored by today's transformers; a value
# other than the one the family's architecture implies describes a different model: refused.
LEGACY_VALUES = {
    "marian": dict(
        normalize_before=False,
        normalize_embedding=False,
        add_final_layer_norm=False,
        static_position_embeddings=True,
        add_bias_logits=False,
        is_decoder=False,
    ),
    "bart": dict(
        normalize_before=False,
        normalize_embedding=True,
        add_final_layer_norm=False,
        static_position_embeddings=False,
        add_bias_logits=False,
        extra_pos_embeddings=2,
        is_decoder=False,
    ),
    "mbart": dict(
        normalize_before=True,
        normalize_embedding=True,
        add_final_layer_norm=True,
        static_position_embeddings=False,
        add_bias_logits=False,
        extra_pos_embeddings=2,
        is_decoder=False,
    ),
    "gpt2": dict(
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        add_cross_attention=False,
        is_decoder=False,
    ),
}


# The options a config must give (the others have transformers' defaults).
_SEQ2SEQ_REQUIRED = ("vocab_size", "d_model", "encoder_layers", "decoder_layers")
_SEQ2SEQ_REQUIRED += ("encoder_attention_heads", "encoder_ffn_dim", "max_position_embeddings")
REQUIRED = {
    "marian": (*_SEQ2SEQ_REQUIRED, "pad_token_id"),
    "bart": (*_SEQ2SEQ_REQUIRED, "pad_token_id"),
    "mbart": (*_SEQ2SEQ_REQUIRED, "pad_token_id"),
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
}


class UnsupportedConfigError(ValueError):
    """A Hugging Face config this project cannot express; names every offending option."""


def model_kind(hf_config: dict[str, Any]) -> str:
    """The project's model kind for a config: "seq2seq" or "lm"."""
    return LM if hf_config.get("model_type") == "gpt2" else SEQ2SEQ


def first_id(value) -> int | None:
    """A token id option that may be a list (eos_token_id): its first entry."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def hf_to_config(
    hf_config: dict[str, Any], dtype: str = "float32", where: str = "config.json"
) -> tuple[TransformerConfig, list[str]]:
    """(TransformerConfig, training-only warnings) for a Hugging Face config dict.

    Raises UnsupportedConfigError naming every option that cannot be expressed.
    """
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise UnsupportedConfigError(
            f"{where}: model_type {model_type!r} is not supported (supported: "
            f"{', '.join(MODEL_TYPES)})"
        )
    problems, warnings = [], []
    missing = [name for name in REQUIRED[model_type] if hf_config.get(name) is None]
    if missing:
        raise UnsupportedConfigError(f"{where}: {model_type} config lacks {', '.join(missing)}")
    for name, value in LEGACY_VALUES[model_type].items():
        if name in hf_config and hf_config[name] != value:
            problems.append(f"{name}={hf_config[name]!r} (only {value!r} is supported)")
    architectures = hf_config.get("architectures") or []
    unknown = [a for a in architectures if a not in ARCHITECTURES[model_type]]
    if unknown:
        problems.append(
            f"architectures={unknown} (supported: {', '.join(ARCHITECTURES[model_type])})"
        )
    activation = hf_config.get(
        "activation_function", "gelu_new" if model_type == "gpt2" else "gelu"
    )
    if activation not in ACTIVATIONS:
        problems.append(f"activation_function={activation!r} (supported: {', '.join(ACTIVATIONS)})")
    if model_type == "gpt2":
        fields = _gpt2_fields(hf_config, warnings)
    else:
        fields = _seq2seq_fields(model_type, hf_config, problems, warnings)
    if problems:
        raise UnsupportedConfigError(
            f"{where}: {model_type} options this project cannot express: " + "; ".join(problems)
        )
    fields.update(
        activation=ACTIVATIONS[activation],
        dtype=dtype,
        param_dtype=dtype,
        lm_head_bias=False,  # transformers' heads have no bias
        mask_target_padding=False,  # decoders are causal only unless a mask is given
        bos_id=hf_config.get("bos_token_id"),
        eos_id=first_id(hf_config.get("eos_token_id")),
    )
    # transformers only warns about special ids outside the vocabulary; so do we, and drop them.
    for name in ("bos_id", "eos_id", "decoder_start_id", "pad_id"):
        value = fields.get(name)
        if value is not None and not 0 <= value < fields["tgt_vocab_size"]:
            warnings.append(f"{name} {value} is outside the vocabulary: not used")
            fields[name] = 0 if name == "pad_id" else None
    try:
        return TransformerConfig(**fields), warnings
    except ValueError as err:
        raise UnsupportedConfigError(f"{where}: {err}") from None


def _seq2seq_fields(model_type, hf, problems, warnings) -> dict[str, Any]:
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
    share = hf.get("share_encoder_decoder_embeddings", True) if model_type == "marian" else True
    if share and not tie:
        problems.append(
            "tie_word_embeddings=False with shared embeddings (transformers then keeps four "
            "separate tables, one of them unused)"
        )
    vocab = hf["vocab_size"]
    tgt_vocab = vocab if share else hf.get("decoder_vocab_size") or vocab
    pre_ln = model_type == "mbart"
    return dict(
        src_vocab_size=vocab,
        tgt_vocab_size=tgt_vocab,
        d_model=hf["d_model"],
        num_heads=hf["encoder_attention_heads"],
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        d_ff=hf["encoder_ffn_dim"],
        dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        activation_dropout_rate=hf.get("activation_dropout", 0.0),
        max_len=hf["max_position_embeddings"],
        norm_first=pre_ln,
        final_norm=pre_ln,
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        share_embeddings=share,
        tie_output=tie,
        positional="sinusoidal" if model_type == "marian" else "learned",
        sinusoid_layout="halves" if model_type == "marian" else "interleaved",
        position_offset=0 if model_type == "marian" else 2,
        separate_positions=model_type != "marian",
        embed_norm=model_type != "marian",
        final_logits_bias=True,
        pad_id=hf["pad_token_id"],
        decoder_start_id=hf.get("decoder_start_token_id"),
    )


def _gpt2_fields(hf, warnings) -> dict[str, Any]:
    d_model = hf["n_embd"]
    resid, embd = hf.get("resid_pdrop", 0.1), hf.get("embd_pdrop", 0.1)
    if embd != resid:
        warnings.append(
            f"embd_pdrop={embd} differs from resid_pdrop={resid}: training uses {resid} for both"
        )
    eos, pad = first_id(hf.get("eos_token_id")), hf.get("pad_token_id")
    return dict(
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        d_model=d_model,
        num_heads=hf["n_head"],
        num_encoder_layers=0,
        num_decoder_layers=hf["n_layer"],
        d_ff=hf.get("n_inner") or 4 * d_model,
        dropout_rate=resid,
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        max_len=hf["n_positions"],
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        norm_first=True,
        final_norm=True,
        tie_output=hf.get("tie_word_embeddings", True),
        positional="learned",
        # No pad token in GPT-2: masks come from attention_mask; pad_id only names a filler.
        pad_id=pad if pad is not None else (eos if eos is not None else 0),
    )
