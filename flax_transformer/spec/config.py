"""TransformerConfig: one frozen, validated description of a model, shared by Flax and torch.

Imports no jax, so the torch twin, the CLI and the converter can read a config cheaply.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# gelu: the exact erf form; gelu_tanh: its tanh approximation (GPT-2's gelu_new); silu = swish.
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONALS = ("sinusoidal", "learned")
# interleaved: the paper's sin/cos alternating; halves: [sin ... | cos ...] (Marian, fairseq).
SINUSOID_LAYOUTS = ("interleaved", "halves")
DTYPES = ("float32", "float64", "bfloat16", "float16")
# How attention is computed; the same function either way (nn/attention.py, torch_reference).
ATTENTION_IMPLS = ("auto", "fused", "reference")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
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
    # Special token ids (None: not set; the tokenizer decides). decoder_start_id is the
    # decoder's first token (Marian: the pad id), bos_id the begin-of-text token.
    bos_id: int | None = None
    eos_id: int | None = None
    decoder_start_id: int | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "num_heads",
            "d_ff",
            "max_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive int, got {value!r}")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} must be a non-negative int, got {value!r}")
        if not problems and self.d_model % self.num_heads:
            problems.append(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        for name in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            problems.append(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not isinstance(self.use_bias, bool):
            problems.append(f"use_bias must be a bool, got {self.use_bias!r}")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.positional not in POSITIONALS:
            problems.append(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            problems.append(
                f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                problems.append(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            problems.append(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        if not problems and not (
            isinstance(self.pad_id, int)
            and 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size)
        ):
            problems.append(
                f"pad_id must be a token id inside both vocabularies, got {self.pad_id!r}"
            )
        problems += self._switch_problems()
        if problems:
            raise ValueError("invalid TransformerConfig: " + "; ".join(problems))

    def _switch_problems(self) -> list[str]:
        """The checks of the fields after attention_impl: (fields, test, what it must be)."""
        is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        vocab = self.tgt_vocab_size if is_int(self.tgt_vocab_size) else 0
        token_id = lambda v: v is None or (is_int(v) and 0 <= v < vocab)  # noqa: E731
        bools = ("embed_norm", "separate_positions", "lm_head_bias", "final_logits_bias")
        bools += ("mask_target_padding",)
        rate = lambda v: v is None or (isinstance(v, (int, float)) and 0.0 <= v < 1.0)  # noqa: E731
        rules = [
            (("sinusoid_layout",), lambda v: v in SINUSOID_LAYOUTS, f"one of {SINUSOID_LAYOUTS}"),
            (("position_offset",), lambda v: is_int(v) and v >= 0, "a non-negative int"),
            (bools, lambda v: isinstance(v, bool), "a bool"),
            (("activation_dropout_rate",), rate, "None or in [0, 1)"),
            (
                ("bos_id", "eos_id", "decoder_start_id"),
                token_id,
                "None or a token id inside the target vocabulary",
            ),
        ]
        return [
            f"{name} must be {wanted}, got {getattr(self, name)!r}"
            for names, ok, wanted in rules
            for name in names
            if not ok(getattr(self, name))
        ]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig field(s): {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"config is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError("config JSON must be an object")
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TransformerConfig:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ValueError(f"cannot read config file {path}: {err}") from None
        try:
            return cls.from_json(text)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


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
