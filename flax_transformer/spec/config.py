"""TransformerConfig: one frozen, validated description of a model, shared by Flax and torch.

Imports no jax, so the torch twin, the CLI and the converter can read a config cheaply.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.spec.kinds import ENCODER, LM, check_kind
from flax_transformer.spec.validate import Bool, Choice, Float, Floats, Int, Text, field_problems

# gelu: the exact erf form; gelu_tanh: its tanh approximation (GPT-2's gelu_new); silu = swish.
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
# "none": no absolute positions (a model with a relative position bias, T5); "rotary": none
# added to the embeddings, the queries and keys of every self-attention rotated by their
# positions instead (Llama, Mistral, Qwen; spec/rotary.py, the rope_* fields).
POSITIONALS = ("sinusoidal", "learned", "none", "rotary")
# How the rotary frequencies are scaled (transformers' rope_type): spec/rotary.py.
ROPE_SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# "layer": LayerNorm (mean subtracted, bias when use_bias); "rms": RMSNorm (no mean, no bias).
NORM_TYPES = ("layer", "rms")
# interleaved: the paper's sin/cos alternating; halves: [sin ... | cos ...] (Marian, fairseq).
SINUSOID_LAYOUTS = ("interleaved", "halves")
# The output of an encoder-only model (kind "encoder"), on its last hidden states: "none" (the
# hidden states), "sequence_pooled" (`head.classifier` on the pooler output: BERT),
# "sequence_tanh" / "sequence_relu" (`head.pre_classifier`, tanh / ReLU, `head.classifier` on
# the first token: RoBERTa / DistilBERT), "token" (`head.classifier` on every token) or
# "masked_lm" (`head.dense`, the activation, `head.norm`, then the logits tied to the token
# embedding plus `head.bias`).
ENCODER_HEADS = ("none", "sequence_pooled", "sequence_tanh", "sequence_relu", "token", "masked_lm")
# The config fields of an encoder's head: a classifier fine-tuned from a bare encoder or a
# masked LM changes them (its labels set them; --init-from takes the rest of the run's config).
HEAD_FIELDS = ("head", "pooler", "num_labels")
DTYPES = ("float32", "float64", "bfloat16", "float16")
# How attention is computed; the same function either way (nn/attention.py, torch_reference).
ATTENTION_IMPLS = ("auto", "fused", "reference")
# The longest max_len accepted. A hard cap, not a memory estimate: one head's attention
# matrix for one sequence of 65536 tokens is 16 GiB in float32, past what one accelerator of
# this project's targets holds, and a larger value (a typo, --max-len 100000000) would only
# fail later with an out-of-memory crash, after the run directory was made. Hugging Face
# models of the supported families use 512-4096.
MAX_LEN_LIMIT = 65536


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """One model, described completely and checked at construction (ValueError naming every bad
    field): sizes, architecture switches, dtypes and special token ids, shared by the Flax model
    and the torch twin."""

    src_vocab_size: int = 256
    tgt_vocab_size: int = 256
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    max_len: int = 512
    norm_first: bool = False  # False: post-LN (the paper); True: pre-LN
    final_norm: bool = False  # LayerNorm after the last encoder / decoder block
    activation: str = "relu"  # one of ACTIVATIONS; "gelu" is the exact erf form, as torch
    layer_norm_eps: float = 1e-5  # torch's default; Flax's own default is 1e-6
    scale_embeddings: bool = False  # multiply embeddings by sqrt(d_model)
    share_embeddings: bool = False  # one table for source and target (needs equal vocab)
    tie_output: bool = False  # logits = x @ target_embedding.T, no lm_head
    positional: str = "sinusoidal"  # "sinusoidal" | "learned"
    pad_id: int = 0
    dtype: str = "float32"  # computation dtype
    param_dtype: str = "float32"  # parameter storage dtype
    remat: bool = False  # rematerialise each block in the backward pass (saves memory)
    use_bias: bool = True  # biases in the blocks' Dense and LayerNorm layers and final norms
    # "reference": explicit softmax(q k^T / sqrt(d)) v; "fused": the framework's fused kernel
    # (jax.nn.dot_product_attention / F.scaled_dot_product_attention); "auto": fused where it
    # was measured faster (Flax: on GPU; the torch twin keeps the reference path).
    attention_impl: str = "auto"
    # Switches for checkpoints written by other code (Hugging Face Marian / BART / GPT-2,
    # docs/hf.md); the defaults are the paper's model as above.
    sinusoid_layout: str = "interleaved"  # one of SINUSOID_LAYOUTS
    position_offset: int = 0  # position p reads row p + offset of the table (BART: 2)
    embed_norm: bool = False  # LayerNorm after embedding + positions (src/tgt_embed_norm)
    separate_positions: bool = False  # learned: one table per stack (src/tgt_pos_embed; BART)
    activation_dropout_rate: float | None = (
        None  # dropout after the FFN activation (None: dropout_rate)
    )
    lm_head_bias: bool = True  # an untied lm_head has a bias (Hugging Face heads have none)
    final_logits_bias: bool = False  # a bias added to the logits after the head (logits_bias)
    mask_target_padding: bool = True  # default decoder mask: causal + pad_id keys; False: causal
    # Switches of T5-style models (and Llama-style ones: RMS norm, gated FFN, no biases).
    norm_type: str = "layer"  # one of NORM_TYPES, for every norm of the model
    # A learned bias added to the attention logits of every self-attention, read from
    # relative_attention_buckets buckets of the key position minus the query position: exact for
    # small distances, log-spaced up to relative_attention_max_distance (bidirectional in the
    # encoder, causal in the decoder); 0: none. One table per stack shared by its layers, or
    # one per layer (relative_attention_per_layer).
    relative_attention_buckets: int = 0
    relative_attention_max_distance: int = 128
    relative_attention_per_layer: bool = False
    scale_attention_logits: bool = True  # divide q.k by sqrt(head_dim); False: no scaling
    attention_head_dim: int | None = None  # width of one head (None: d_model // num_heads)
    # The feed-forward's input is two projections: activation(linear1(x)) * linear3(x).
    gated_ffn: bool = False
    scale_decoder_output: bool = False  # multiply the last hidden state by d_model**-0.5
    # Switches of BERT-style encoder-only models (kind "encoder").
    type_vocab_size: int = 0  # token type (segment) embeddings `type_embed` added; 0: none
    # Positions count the non-pad tokens only: the k-th real token has position k - 1, a pad
    # token position -1 (row position_offset - 1 of the table: RoBERTa's padding_idx row).
    positions_skip_padding: bool = False
    pooler: bool = False  # `pooler`: dense + tanh on the first token's last hidden state
    head: str = "none"  # one of ENCODER_HEADS
    num_labels: int = 2  # the classification heads' outputs
    # Special token ids (None: not set; the tokenizer decides). decoder_start_id is the
    # decoder's first token (Marian: the pad id), bos_id the begin-of-text token.
    bos_id: int | None = None
    eos_id: int | None = None
    decoder_start_id: int | None = None
    # Switches of Llama-lineage decoders (Llama, Mistral, Qwen2, Qwen3; docs/hf.md). Rotary
    # positions (positional="rotary"): the base wavelength, the scaling rule and its
    # parameters, as transformers' rope_parameters name them (spec/rotary.py).
    rope_theta: float = 10000.0
    rope_scaling: str = "default"  # one of ROPE_SCALINGS
    rope_factor: float = 1.0  # linear, dynamic, llama3, yarn: how far the context is stretched
    # llama3 / yarn: the pretraining length (original_max_position_embeddings); dynamic: the
    # length past which the base grows (transformers' max_position_embeddings).
    rope_original_max_len: int | None = None
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_beta_fast: float = 32.0  # yarn
    rope_beta_slow: float = 1.0  # yarn
    rope_attention_factor: float | None = None  # yarn: cos/sin scale (None: from the factor)
    rope_mscale: float | None = None  # yarn: attention factor from mscale / mscale_all_dim
    rope_mscale_all_dim: float | None = None
    rope_truncate: bool = True  # yarn: the correction range rounded outwards
    # Grouped-query attention: the keys and values have num_kv_heads heads, each shared by
    # num_heads / num_kv_heads query heads (1: multi-query); the KV cache holds only those.
    num_kv_heads: int | None = None  # None: num_heads
    qkv_bias: bool | None = None  # biases on query, key, value (None: use_bias; Qwen2: True)
    qk_norm: bool = False  # an RMS norm over each head of the queries and keys (Qwen3)
    # Sliding-window attention: a query sees the sliding_window latest keys (itself included)
    # in the layers from sliding_window_from_layer on (Qwen2's max_window_layers); None: all.
    sliding_window: int | None = None
    sliding_window_from_layer: int = 0
    # Switches of Gemma-lineage decoders (Gemma 1/2/3; docs/hf.md).
    # RMS norms multiply by 1 + weight (the weights stored as offsets from 1, initialised to 0).
    norm_weight_offset: bool = False
    # Which layers slide: one letter per layer, cycled over the layers ("s" sliding, "f" full
    # attention; Gemma 2: "sf", Gemma 3: "sssssf"); None: sliding_window_from_layer's rule.
    sliding_window_pattern: str | None = None
    rope_local_theta: float | None = None  # the sliding layers' own rope base, unscaled (Gemma 3)
    # q.k is divided by sqrt(attention_scale_dim), not sqrt(head_dim) (query_pre_attn_scalar).
    attention_scale_dim: float | None = None
    attention_logit_softcap: float | None = None  # attention logits -> cap * tanh(logits / cap)
    final_logit_softcap: float | None = None  # output logits -> cap * tanh(logits / cap)
    # norm_first blocks also normalise each sublayer's output before the residual add
    # (`attn_out_norm`, `ffn_out_norm`: Gemma 2/3's post-attention / post-feed-forward norms).
    sublayer_output_norm: bool = False
    # Switches of Phi-3. Rotary positions turn only the first rotary_fraction of each head's
    # dims (partial_rotary_factor), the rest pass through.
    rotary_fraction: float = 1.0
    # longrope: each frequency divided by its own factor, from rope_short_factors while a
    # call's sequence (its largest position + 1) fits rope_original_max_len, else from
    # rope_long_factors; cos / sin times the attention factor (rope_attention_factor, else
    # from rope_factor).
    rope_short_factors: tuple[float, ...] | None = None
    rope_long_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("rope_short_factors", "rope_long_factors"):  # JSON gives lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = field_problems(self, FIELD_RULES)
        checked = not any(p.split()[0] in ("d_model", "num_heads") for p in problems)
        if checked and self.attention_head_dim is None and self.d_model % self.num_heads:
            problems.append(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        max_len_ok = not any(p.startswith("max_len ") for p in problems)
        if max_len_ok and self.max_len > MAX_LEN_LIMIT:
            problems.append(
                f"max_len {self.max_len} is larger than {MAX_LEN_LIMIT}, the longest this "
                "project accepts (one attention matrix of that length would not fit in memory)"
            )
        buckets, distance = self.relative_attention_buckets, self.relative_attention_max_distance
        relative_ok = not any(p.startswith("relative_attention_") for p in problems)
        if relative_ok and buckets and (buckets < 4 or distance <= buckets // 2):
            problems.append(
                "relative_attention_buckets must be 0 or >= 4, and relative_attention_max_distance "
                f"> relative_attention_buckets // 2, got {buckets} and {distance} (half the "
                "buckets of a direction are exact distances, the rest log-spaced up to the max)"
            )
        problems += _llm_problems(self, problems)
        if self.head == "sequence_pooled" and not self.pooler:
            problems.append("head 'sequence_pooled' needs pooler=True (it reads the pooler)")
        if self.positions_skip_padding and (
            self.positional != "learned" or self.position_offset < 1
        ):
            problems.append(
                "positions_skip_padding needs positional='learned' and position_offset >= 1 "
                "(pad tokens read row position_offset - 1)"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            problems.append(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        if not problems and not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            problems.append(
                f"pad_id must be a token id inside both vocabularies, got {self.pad_id!r}"
            )
        vocab = self.tgt_vocab_size if not problems else None
        for name in ("bos_id", "eos_id", "decoder_start_id"):
            value = getattr(self, name)
            if vocab is not None and value is not None and not value < vocab:
                problems.append(
                    f"{name} must be a token id inside the target vocabulary, got {value!r}"
                )
        if problems:
            raise ValueError("invalid TransformerConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        """The width of one attention head: attention_head_dim, else d_model // num_heads."""
        if self.attention_head_dim is not None:
            return self.attention_head_dim
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The key / value heads: num_kv_heads, else num_heads."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def attention_dim(self) -> int:
        """num_heads * head_dim: the width of the query, key and value projections."""
        return self.num_heads * self.head_dim

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with `changes` applied, checked again (ValueError on a bad value)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (the keys of config.json)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The config as indented JSON with sorted keys (what config.json holds)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        """A config from field values (missing ones take the defaults); ValueError naming unknown
        fields or bad values."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s): {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        """A config from JSON text; ValueError if it is not a JSON object, names unknown fields
        or holds bad values."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"config is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("config JSON must be an object")
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        """Write the config as JSON to `path`, atomically."""
        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TransformerConfig:
        """A config from a JSON file; ValueError naming `path` if it cannot be read or is not a
        valid config."""
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ValueError(f"cannot read config file {path}: {err}") from None
        try:
            return cls.from_json(text)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def _llm_problems(cfg: TransformerConfig, found: list[str]) -> list[str]:
    """The cross-field rules of the rotary, grouped-query and sliding-window switches (fields
    with a problem of their own already are skipped)."""
    bad = {p.split()[0] for p in found}
    problems = []
    fields = {"num_heads", "num_kv_heads", "d_model", "attention_head_dim"}
    if not fields & bad and cfg.num_heads % cfg.kv_heads:
        problems.append(
            f"num_heads ({cfg.num_heads}) must be a multiple of num_kv_heads ({cfg.kv_heads}): "
            "each key / value head serves the same number of query heads"
        )
    if cfg.positional == "rotary" and not fields & bad and cfg.head_dim % 2:
        problems.append(f"positional 'rotary' needs an even head_dim, got {cfg.head_dim}")
    rope = {f for f in bad if f.startswith("rope_")}
    if cfg.rope_scaling in ("dynamic", "llama3", "yarn", "longrope") and not rope:
        if cfg.rope_original_max_len is None:
            problems.append(f"rope_scaling {cfg.rope_scaling!r} needs rope_original_max_len")
    if cfg.rope_scaling == "llama3" and not rope:
        if cfg.rope_high_freq_factor <= cfg.rope_low_freq_factor:
            problems.append(
                "rope_scaling 'llama3' needs rope_high_freq_factor > rope_low_freq_factor, got "
                f"{cfg.rope_high_freq_factor} and {cfg.rope_low_freq_factor}"
            )
    if cfg.rope_scaling != "default" and cfg.positional != "rotary" and "positional" not in bad:
        problems.append(f"rope_scaling {cfg.rope_scaling!r} needs positional='rotary'")
    if cfg.rope_scaling == "longrope" and not rope and not fields & bad:
        half = cfg.head_dim * cfg.rotary_fraction // 2 if "rotary_fraction" not in bad else None
        for name in ("rope_short_factors", "rope_long_factors"):
            factors = getattr(cfg, name)
            if half is not None and (factors is None or len(factors) != half):
                problems.append(
                    f"rope_scaling 'longrope' needs {name}: {int(half)} numbers (one per "
                    f"frequency), got {factors!r}"
                )
    if "rotary_fraction" not in bad and not fields & bad and cfg.positional == "rotary":
        if int(cfg.head_dim * cfg.rotary_fraction) % 2:
            problems.append(
                f"rotary_fraction {cfg.rotary_fraction} of head_dim {cfg.head_dim} must turn "
                "an even number of dims"
            )
    if cfg.rope_local_theta is not None and cfg.positional != "rotary" and "positional" not in bad:
        problems.append("rope_local_theta needs positional='rotary'")
    pattern = cfg.sliding_window_pattern
    if pattern is not None and "sliding_window_pattern" not in bad:
        if not pattern or set(pattern) - {"s", "f"}:
            problems.append(
                "sliding_window_pattern must be letters 's' (sliding) and 'f' (full attention), "
                f"one per layer (cycled), got {pattern!r}"
            )
        if cfg.sliding_window_from_layer:
            problems.append(
                "sliding_window_pattern and sliding_window_from_layer exclude each other: the "
                "pattern names every layer"
            )
    return problems


def sliding_layer(config: TransformerConfig, layer: int) -> bool:
    """Whether layer `layer` (0-based) is a sliding-window (local) layer: its letter of
    config.sliding_window_pattern (cycled), else from sliding_window_from_layer on; never
    without config.sliding_window."""
    if config.sliding_window is None:
        return False
    pattern = config.sliding_window_pattern
    if pattern is not None:
        return pattern[layer % len(pattern)] == "s"
    return layer >= config.sliding_window_from_layer


# ----------------------------------------------------------------------------- validation
# Every field's type and range, checked in __post_init__ (cross-field rules are there too).
# A new field adds one line here; tests/test_bad_input_values.py fails for a field without one.
FIELD_RULES = {
    "src_vocab_size": Int(min=1),
    "tgt_vocab_size": Int(min=1),
    "d_model": Int(min=1),
    "num_heads": Int(min=1),
    "num_encoder_layers": Int(min=0),
    "num_decoder_layers": Int(min=0),
    "d_ff": Int(min=1),
    "dropout_rate": Float(ge=0.0, lt=1.0),
    "attention_dropout_rate": Float(ge=0.0, lt=1.0),
    "max_len": Int(min=1),
    "norm_first": Bool(),
    "final_norm": Bool(),
    "activation": Choice(ACTIVATIONS),
    "layer_norm_eps": Float(gt=0.0),
    "scale_embeddings": Bool(),
    "share_embeddings": Bool(),
    "tie_output": Bool(),
    "positional": Choice(POSITIONALS),
    "pad_id": Int(min=0),
    "dtype": Choice(DTYPES),
    "param_dtype": Choice(DTYPES),
    "remat": Bool(),
    "use_bias": Bool(),
    "attention_impl": Choice(ATTENTION_IMPLS),
    "sinusoid_layout": Choice(SINUSOID_LAYOUTS),
    "position_offset": Int(min=0),
    "embed_norm": Bool(),
    "separate_positions": Bool(),
    "activation_dropout_rate": Float(ge=0.0, lt=1.0, optional=True),
    "lm_head_bias": Bool(),
    "final_logits_bias": Bool(),
    "mask_target_padding": Bool(),
    "norm_type": Choice(NORM_TYPES),
    "relative_attention_buckets": Int(min=0, why="(0 = no relative position bias)"),
    "relative_attention_max_distance": Int(min=1),
    "relative_attention_per_layer": Bool(),
    "scale_attention_logits": Bool(),
    "attention_head_dim": Int(min=1, optional=True),
    "gated_ffn": Bool(),
    "scale_decoder_output": Bool(),
    "type_vocab_size": Int(min=0, why="(0 = no token type embeddings)"),
    "positions_skip_padding": Bool(),
    "pooler": Bool(),
    "head": Choice(ENCODER_HEADS),
    "num_labels": Int(min=1),
    "bos_id": Int(min=0, optional=True),
    "eos_id": Int(min=0, optional=True),
    "decoder_start_id": Int(min=0, optional=True),
    "rope_theta": Float(gt=0.0),
    "rope_scaling": Choice(ROPE_SCALINGS),
    "rope_factor": Float(gt=0.0),
    "rope_original_max_len": Int(min=1, optional=True),
    "rope_low_freq_factor": Float(gt=0.0),
    "rope_high_freq_factor": Float(gt=0.0),
    "rope_beta_fast": Float(gt=0.0),
    "rope_beta_slow": Float(gt=0.0),
    "rope_attention_factor": Float(gt=0.0, optional=True),
    "rope_mscale": Float(ge=0.0, optional=True),
    "rope_mscale_all_dim": Float(ge=0.0, optional=True),
    "rope_truncate": Bool(),
    "num_kv_heads": Int(min=1, optional=True),
    "qkv_bias": Bool(optional=True),
    "qk_norm": Bool(),
    "sliding_window": Int(min=1, optional=True, why="(None = no window)"),
    "sliding_window_from_layer": Int(min=0),
    "norm_weight_offset": Bool(),
    "sliding_window_pattern": Text(optional=True),
    "rope_local_theta": Float(gt=0.0, optional=True),
    "attention_scale_dim": Float(gt=0.0, optional=True),
    "attention_logit_softcap": Float(gt=0.0, optional=True),
    "final_logit_softcap": Float(gt=0.0, optional=True),
    "sublayer_output_norm": Bool(),
    "rotary_fraction": Float(gt=0.0, le=1.0),
    "rope_short_factors": Floats(),
    "rope_long_factors": Floats(),
}


def kind_problems(config: TransformerConfig, kind: str, *, building: bool = False) -> list[str]:
    """What makes `config` unusable for a model of `kind` (empty: nothing). The config alone
    allows 0 layers (an encoder-only torch.nn port has no decoder, an LM no encoder); a model
    needs decoder layers (without them a seq2seq output ignores the source, and training fails
    late looking for the decoder), a seq2seq run encoder layers too, a bare encoder (kind
    "encoder") encoder layers only. `building`: what the linen model itself needs (a seq2seq
    model of 0 encoder layers is a function, its decoder reading the source's embeddings: the
    twins agree on it; the commands still ask for encoder layers)."""
    kind = check_kind(kind)
    needed = {
        LM: ["num_decoder_layers"],
        ENCODER: ["num_encoder_layers"],
    }.get(kind, ["num_decoder_layers"] + ([] if building else ["num_encoder_layers"]))
    what = {LM: "a decoder-only LM", ENCODER: "a bare encoder"}.get(kind, "a seq2seq model")
    problems = [
        f"{what} needs {name} >= 1, got {getattr(config, name)}"
        for name in needed
        if getattr(config, name) < 1
    ]
    if kind != LM and config.positional == "rotary":
        problems.append(f"positional 'rotary' is for decoder-only LMs, not {what}")
    if kind != LM and config.sliding_window is not None:
        problems.append(f"sliding_window is for decoder-only LMs, not {what}")
    return problems


def check_config_for_kind(
    config: TransformerConfig, kind: str, *, building: bool = False
) -> TransformerConfig:
    """`config`, or a ValueError naming each field `kind_problems` finds."""
    problems = kind_problems(config, kind, building=building)
    if problems:
        raise ValueError("invalid TransformerConfig: " + "; ".join(problems))
    return config


def config_diff(
    a: TransformerConfig, b: TransformerConfig, *, ignore: tuple[str, ...] = ()
) -> dict[str, tuple[Any, Any]]:
    """{field: (a's value, b's value)} for every field that differs, except those in `ignore`.

    The one comparison behind train.py's resume check, convert's config check and the parity
    report's config differences.
    """
    return {
        field: (value, getattr(b, field))
        for field, value in a.to_dict().items()
        if field not in ignore and getattr(b, field) != value
    }
