"""What a Hugging Face model family is to this project: one frozen `Family` per family.

Everything the loader (hf/config.py, hf/weights.py), the saver and exporter (hf/model.py,
hf/run_dir.py), the tokenizer and generation need to know about a family that is not common
to all of them lives in its Family: the config mapping, the weight names, the switches, the
defaults. The code that reads a Family never asks which family it is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flax_transformer.hf.families.field_types import FieldType

HFConfig = Mapping[str, Any]  # config.json, as read


class UnsupportedConfigError(ValueError):
    """A Hugging Face config this project cannot express; names every offending option."""


def first_id(value) -> int | None:
    """A token id option that may be a list (eos_token_id): its first entry."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


@dataclasses.dataclass(frozen=True)
class FusedQKV:
    """One Hugging Face tensor holding several canonical ones side by side along its output
    axis (GPT-2's c_attn: query | key | value; Phi-3's qkv_proj and gate_up_proj), split into
    them on load and concatenated back on save."""

    hf_template: str  # "transformer.h.{i}.attn.c_attn.{p}"
    canonical_template: str  # "decoder.layers.{i}.self_attn.{name}.{p}"; name: one of `names`
    transposed: bool  # the HF weight is stored (in, out) (Conv1D), Linear's is (out, in)
    names: tuple[str, ...] = ("query", "key", "value")
    # sizes(hf_config) -> each part's width (None: equal parts; grouped-query: q wider than k).
    sizes: Callable[[Mapping[str, Any]], tuple[int, ...]] | None = None

    def widths(self, hf_config: Mapping[str, Any]):
        """The parts' widths for this config, or their count when equal (LazyArray.split)."""
        return len(self.names) if self.sizes is None else self.sizes(hf_config)

    def axis(self, leaf: str) -> int:
        """The fused axis of the HF tensor's `leaf` (weight | bias): the output axis."""
        return -1 if self.transposed or leaf == "bias" else 0


@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity
class Family:
    """One Hugging Face model family: how its config.json, weights and defaults map here."""

    # config.json "model_type" values it reads (the first is its name).
    model_types: tuple[str, ...]
    kind: str  # this project's model kind: "seq2seq" | "lm" | "encoder" (spec/kinds.py)
    # config.json "architectures" whose weights it maps.
    architectures: tuple[str, ...]
    # Options a config must give (the others have transformers' defaults).
    required: tuple[str, ...]
    # Options with one supported value (often from older transformers versions, still in
    # config.json files); another value describes a different model: refused.
    legacy_values: Mapping[str, Any]
    # transformers' activation when config.json names none.
    default_activation: str
    # config_to_switches(hf_config, problems, warnings) -> the TransformerConfig fields of the
    # family (sizes, switches, special ids); appends what it cannot express to `problems`, and
    # training-only differences to `warnings`. hf/config.py adds what all families share.
    config_to_switches: Callable[[HFConfig, list[str], list[str]], dict[str, Any]]
    # (HF template, canonical template) pairs, read in both directions; {i} a layer index,
    # {p} weight|bias. Or a function of config.json giving them (when the names depend on
    # the config: T5's gated or plain feed-forward).
    weight_renames: tuple[tuple[str, str], ...] | Callable[[HFConfig], tuple[tuple[str, str], ...]]
    # The prefix of the base model's keys (absent when a base model, e.g. MarianModel, was saved).
    prefix: str
    # tied_groups(hf_config) -> [[source, *targets], ...]: HF keys holding one tensor when
    # tie_word_embeddings is true (transformers 5's `_tied_weights_keys`).
    tied_groups: Callable[[HFConfig], list[list[str]]]
    # Keys transformers ignores when loading (buffers older versions saved, fairseq leftovers).
    ignored_keys: re.Pattern | None = None
    # The weights of the family's other classes (another head, the pooler, a pretraining head:
    # BERT's cls.seq_relationship), as transformers names them (prefix included; matched
    # whole): from_pretrained leaves them unused when the class loaded has no place for them
    # (bert-base-uncased, saved from BertForPreTraining, read as BertForSequenceClassification).
    # Dropped when the config's class does not use them, named in one warning; any other
    # unexpected key is an error.
    other_class_keys: re.Pattern | None = None
    # HF weights stored (in, out) (Conv1D), transposed to Linear's (out, in).
    transposed_keys: re.Pattern | None = None
    fused_qkv: FusedQKV | None = None
    fused_ffn: FusedQKV | None = None  # the feed-forward's fused tensor (Phi-3's gate_up_proj)
    # A (1, V) final_logits_bias buffer after the head (zeros when a file lacks it).
    final_logits_bias: bool = False
    # target_vocab(hf_config) -> the decoder's vocabulary size.
    target_vocab: Callable[[HFConfig], int] = lambda hf: hf["vocab_size"]
    # Position tables older checkpoints stored though they are constants: checked against the
    # config's sinusoid and dropped (a trained table is refused).
    stored_sinusoid_keys: re.Pattern | None = None
    # shift_right(input_ids, hf_config) -> the decoder inputs transformers builds when none
    # are given; None: the family builds none (the caller must give them).
    shift_right: Callable[[np.ndarray, HFConfig], np.ndarray] | None = None
    # The config.json option holding the position table's length (generation's default
    # max_length stays within it).
    max_positions_key: str = "max_position_embeddings"
    # The types of the config.json fields the family reads, as transformers' config class
    # declares them (field_types.py; the fields every family reads are field_types.COMMON).
    field_types: Mapping[str, FieldType] = dataclasses.field(default_factory=dict)
    # (width, heads) config.json keys: the width must be divisible by the heads.
    width_and_heads: tuple[tuple[str, str], ...] = ()
    # The kind of an architecture (config.json "architectures") whose kind is not `kind`
    # (T5EncoderModel: "encoder"), as transformers' AutoModel picks the class from it.
    architecture_kinds: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # tied_groups apply only when tie_word_embeddings is true (False: the family's function
    # decides alone; T5 ties its embeddings always and its head by the weights).
    ties_only_when_tied: bool = True
    # resolve_config(hf_config, state) -> config.json as transformers reads it together with
    # these weights (T5: transformers' defaults for missing options, the head untied when the
    # file holds an lm_head.weight of its own); None: as it is. hf.load applies it first.
    resolve_config: Callable[[HFConfig, Mapping[str, np.ndarray]], dict] | None = None
    # The config.json option naming the activation, and a function reading transformers'
    # activation name from config.json (None: that option, else default_activation).
    activation_key: str = "activation_function"
    read_activation: Callable[[HFConfig], Any] | None = None

    # Architectures whose save_pretrained writes the keys without `prefix` (a base model:
    # BertModel writes embeddings.*, BertForSequenceClassification bert.embeddings.*).
    bare_architectures: tuple[str, ...] = ()

    @property
    def fused(self) -> tuple[FusedQKV, ...]:
        """The family's fused tensors (fused_qkv, fused_ffn), those it has."""
        return tuple(f for f in (self.fused_qkv, self.fused_ffn) if f is not None)

    @property
    def name(self) -> str:
        """The family's name: its first config.json model_type (e.g. "marian")."""
        return self.model_types[0]

    def architecture(self, hf_config: HFConfig) -> str:
        """The class transformers' AutoModel builds for this config: config.json's first
        architecture the family maps, else the family's first (for messages)."""
        architectures = hf_config.get("architectures") or []
        for name in architectures if isinstance(architectures, list) else []:
            if name in self.architectures:
                return name
        return self.architectures[0]

    def kind_for(self, hf_config: HFConfig) -> str:
        """The model kind of this config: its first architecture's (architecture_kinds), else
        the family's."""
        architectures = hf_config.get("architectures") or []
        for name in architectures if isinstance(architectures, list) else []:
            if name in self.architecture_kinds:
                return self.architecture_kinds[name]
        return self.kind

    def saved_prefix(self, hf_config: HFConfig) -> str:
        """The prefix save_pretrained writes before the base model's keys for this config:
        none for a bare_architectures model (config.json's first architecture), else
        `prefix`."""
        architectures = hf_config.get("architectures") or []
        first = architectures[0] if isinstance(architectures, list) and architectures else None
        return "" if first in self.bare_architectures else self.prefix

    def renames(self, hf_config: HFConfig) -> tuple[tuple[str, str], ...]:
        """The (HF template, canonical template) pairs for this config."""
        rules = self.weight_renames
        return rules(hf_config) if callable(rules) else rules

    def activation(self, hf_config: HFConfig):
        """transformers' activation name (e.g. "gelu_new") of this config, as found in it (not
        checked: hf/config.py checks it)."""
        if self.read_activation is not None:
            return self.read_activation(hf_config)
        return hf_config.get(self.activation_key, self.default_activation)

    def resolved(self, hf_config: HFConfig, state: Mapping[str, np.ndarray]) -> dict:
        """config.json as transformers reads it with these weights (resolve_config)."""
        if self.resolve_config is None:
            return dict(hf_config)
        return self.resolve_config(hf_config, state)

    def max_positions(self, hf_config: HFConfig) -> int | None:
        """The length of the model's position table, as config.json gives it."""
        return hf_config.get(self.max_positions_key)
