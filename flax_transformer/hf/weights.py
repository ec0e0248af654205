"""Hugging Face state dicts (marian, bart, mbart, gpt2) <-> this project's canonical torch keys.

One rename table per family, read in both directions: a template such as
`model.encoder.layers.{i}.fc1.{p}` <-> `encoder.layers.{i}.ffn.linear1.{p}`. Beyond renaming:
GPT-2's Conv1D weights are stored (in, out), so they are transposed to Linear's (out, in), and
its fused `c_attn` (d, 3d) is split into query / key / value; `final_logits_bias` (1, V) is the
(V,) `logits_bias.bias`. Tied weights are resolved as transformers resolves them
(`tied_groups`). numpy only (the expected shapes come from the model, through
jax.eval_shape); the tree check is spec/tree_check.py's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flax_transformer.interop.convert import (
    expected_param_shapes,
    flax_to_torch_state,
    torch_state_to_params,
)
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.naming import flax_path_to_torch_key, is_transposed
from flax_transformer.spec.sinusoid import sinusoidal_table
from flax_transformer.spec.tree_check import ConversionError, check_tree

_ATTENTION = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "out"}


def _seq2seq_rules(model_type: str) -> list[tuple[str, str]]:
    """(HF template, canonical template) pairs of an encoder-decoder family."""
    rules = [
        ("model.shared.weight", "shared_embed.weight"),
        ("model.encoder.embed_tokens.weight", "src_embed.weight"),
        ("model.decoder.embed_tokens.weight", "tgt_embed.weight"),
        ("lm_head.weight", "lm_head.weight"),
    ]
    for hf_stack, stack, norms in (
        ("encoder", "encoder", {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}),
        (
            "decoder",
            "decoder",
            {
                "self_attn_layer_norm": "norm1",
                "encoder_attn_layer_norm": "norm2",
                "final_layer_norm": "norm3",
            },
        ),
    ):
        hf_layer, layer = f"model.{hf_stack}.layers.{{i}}", f"{stack}.layers.{{i}}"
        attentions = {"self_attn": "self_attn"}
        if hf_stack == "decoder":
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
        side = "src" if hf_stack == "encoder" else "tgt"
        if model_type != "marian":  # learned positions and the embedding LayerNorm
            rules.append((f"model.{hf_stack}.embed_positions.weight", f"{side}_pos_embed.weight"))
            rules.append(
                (f"model.{hf_stack}.layernorm_embedding.{{p}}", f"{side}_embed_norm.{{p}}")
            )
        if model_type == "mbart":  # pre-LN: a LayerNorm after each stack
            rules.append((f"model.{hf_stack}.layer_norm.{{p}}", f"{stack}.norm.{{p}}"))
    return rules


# GPT-2: Conv1D weights (in, out) are transposed; c_attn is split (see _split_c_attn).
_GPT2_RULES = [
    ("transformer.wte.weight", "tgt_embed.weight"),
    ("transformer.wpe.weight", "pos_embed.weight"),
    ("transformer.ln_f.{p}", "decoder.norm.{p}"),
    ("lm_head.weight", "lm_head.weight"),
    ("transformer.h.{i}.ln_1.{p}", "decoder.layers.{i}.norm1.{p}"),
    ("transformer.h.{i}.ln_2.{p}", "decoder.layers.{i}.norm2.{p}"),
    ("transformer.h.{i}.attn.c_proj.{p}", "decoder.layers.{i}.self_attn.out.{p}"),
    ("transformer.h.{i}.mlp.c_fc.{p}", "decoder.layers.{i}.ffn.linear1.{p}"),
    ("transformer.h.{i}.mlp.c_proj.{p}", "decoder.layers.{i}.ffn.linear2.{p}"),
]
_GPT2_CONV1D = re.compile(r"^transformer\.h\.\d+\.(attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
_C_ATTN = re.compile(r"^transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)$")
_QKV = re.compile(r"^decoder\.layers\.(\d+)\.self_attn\.(query|key|value)\.(weight|bias)$")

# Keys transformers ignores when loading (buffers older versions saved, fairseq leftovers).
IGNORED = {
    "gpt2": re.compile(r"\.attn\.(bias|masked_bias)$"),
    "bart": re.compile(r"^model\.(encoder|decoder)\.version$"),
    "mbart": re.compile(r"^model\.(encoder|decoder)\.version$"),
}
# The prefix of the base model's keys, absent when a base model (e.g. MarianModel) was saved.
PREFIX = {"marian": "model.", "bart": "model.", "mbart": "model.", "gpt2": "transformer."}
HEAD_KEYS = ("lm_head.weight", "final_logits_bias")
MARIAN_POSITIONS = re.compile(r"^model\.(encoder|decoder)\.embed_positions\.weight$")


@functools.cache
def _template_regex(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)")
    return re.compile("^" + pattern.replace(r"\{p\}", r"(?P<p>weight|bias)") + "$")


def _rename(key: str, rules: list[tuple[str, str]]) -> str | None:
    """The other side's name of `key` by the first matching (from, to) template, or None."""
    for source, target in rules:
        match = _template_regex(source).match(key)
        if match:
            return target.format(**match.groupdict())
    return None


def _rules(model_type: str) -> list[tuple[str, str]]:
    return _GPT2_RULES if model_type == "gpt2" else _seq2seq_rules(model_type)


def tied_groups(hf_config: Mapping[str, Any]) -> list[list[str]]:
    """Groups [source, *targets] of HF keys holding one tensor (transformers 5's
    `_tied_weights_keys`, applied only when tie_word_embeddings is true)."""
    model_type = hf_config["model_type"]
    if not hf_config.get("tie_word_embeddings", True):
        return []
    if model_type == "gpt2":
        return [["transformer.wte.weight", "lm_head.weight"]]
    if model_type == "marian" and not hf_config.get("share_encoder_decoder_embeddings", True):
        return [["model.decoder.embed_tokens.weight", "lm_head.weight"]]
    return [
        [
            "model.shared.weight",
            "model.encoder.embed_tokens.weight",
            "model.decoder.embed_tokens.weight",
            "lm_head.weight",
        ]
    ]


# ----------------------------------------------------------------------------- HF -> canonical
def normalize_hf_state(
    state: Mapping[str, np.ndarray],
    hf_config: Mapping[str, Any],
    where: str,
    marian_table: Callable[[], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The state as transformers' from_pretrained sees it: the base-model prefix added where a
    base model was saved, ignored keys dropped, each tied group reduced to its source (a target
    stands in for a missing source, as transformers' symmetric tying does), Marian's stored
    sinusoid tables (older checkpoints) checked against `marian_table()` and dropped, and a
    missing `final_logits_bias` set to zeros (transformers leaves it at its zero init)."""
    model_type = hf_config["model_type"]
    prefix = PREFIX[model_type]
    state = dict(state)
    if state and not any(k.startswith(prefix) for k in state):
        state = {(k if k in HEAD_KEYS else prefix + k): v for k, v in state.items()}
    if model_type in IGNORED:
        state = {k: v for k, v in state.items() if not IGNORED[model_type].search(k)}
    for source, *targets in tied_groups(hf_config):
        present = [k for k in (source, *targets) if k in state]
        if present:
            state[source] = state[present[0]]
        for target in targets:
            state.pop(target, None)
    if model_type == "marian":
        for key in [k for k in state if MARIAN_POSITIONS.match(k)]:
            table = np.asarray(state.pop(key))
            expected = marian_table() if marian_table else None
            if expected is not None and (
                table.shape != expected.shape
                or not np.array_equal(table.astype(np.float32), expected.astype(np.float32))
            ):
                raise ConversionError(
                    f"{where}: {key} is not the sinusoidal table transformers' Marian computes "
                    f"(shape {table.shape}); a trained position table is not supported"
                )
    if model_type != "gpt2" and "final_logits_bias" not in state and state:
        vocab = _target_vocab(hf_config)
        dtype = next(iter(state.values())).dtype
        state["final_logits_bias"] = np.zeros((1, vocab), dtype)
    return state


def _target_vocab(hf_config: Mapping[str, Any]) -> int:
    if hf_config["model_type"] == "marian" and not hf_config.get(
        "share_encoder_decoder_embeddings", True
    ):
        return hf_config.get("decoder_vocab_size") or hf_config["vocab_size"]
    return hf_config["vocab_size"]


def hf_to_canonical(state: Mapping[str, np.ndarray], model_type: str) -> dict[str, np.ndarray]:
    """A normalized HF state (normalize_hf_state) -> {canonical torch key: array}."""
    rules, canonical = _rules(model_type), {}
    for key, value in state.items():
        value = np.asarray(value)
        if key == "final_logits_bias":
            canonical["logits_bias.bias"] = value.reshape(-1)
            continue
        attn = _C_ATTN.match(key) if model_type == "gpt2" else None
        if attn:
            layer, leaf = attn.groups()
            pieces = np.split(value, 3, axis=-1)  # (d, 3d) -> 3 x (d, d); (3d,) -> 3 x (d,)
            for name, piece in zip(("query", "key", "value"), pieces, strict=True):
                piece = piece.T if leaf == "weight" else piece  # Conv1D (in, out) -> (out, in)
                canonical[f"decoder.layers.{layer}.self_attn.{name}.{leaf}"] = piece
            continue
        name = _rename(key, rules)
        if name is None:  # check_hf_state reports these first, with every other problem
            raise ConversionError(f"no canonical name for Hugging Face tensor {key!r}")
        if model_type == "gpt2" and _GPT2_CONV1D.match(key):
            value = value.T
        canonical[name] = value
    return canonical


# ----------------------------------------------------------------------------- canonical -> HF
def canonical_to_hf(state: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """{canonical torch key: array} -> the HF state dict transformers' save_pretrained writes
    (tied targets absent). Works on any arrays with .T / reshape / concatenate."""
    reverse = [(target, source) for source, target in _rules(model_type)]
    hf: dict[str, Any] = {}
    qkv: dict[tuple[str, str], dict[str, Any]] = {}
    for key, value in state.items():
        if key == "logits_bias.bias":
            hf["final_logits_bias"] = np.reshape(value, (1, -1))
            continue
        match = _QKV.match(key) if model_type == "gpt2" else None
        if match:
            layer, name, leaf = match.groups()
            qkv.setdefault((layer, leaf), {})[name] = value
            continue
        name = _rename(key, reverse)
        if name is None:
            raise ConversionError(f"no Hugging Face {model_type} name for parameter {key!r}")
        if model_type == "gpt2" and _GPT2_CONV1D.match(name):
            value = np.transpose(value)
        hf[name] = value
    for (layer, leaf), parts in qkv.items():
        pieces = [parts[n] for n in ("query", "key", "value")]
        if leaf == "weight":
            pieces = [np.transpose(p) for p in pieces]  # (out, in) -> Conv1D (in, out)
        hf[f"transformer.h.{layer}.attn.c_attn.{leaf}"] = np.concatenate(pieces, axis=-1)
    return hf


def expected_hf_shapes(canonical_shapes: Mapping[str, tuple[int, ...]], model_type: str):
    """{HF key: shape} of the HF state a model with these canonical shapes has."""
    fake = {k: np.broadcast_to(np.zeros((), np.float32), s) for k, s in canonical_shapes.items()}
    return {k: tuple(np.shape(v)) for k, v in canonical_to_hf(fake, model_type).items()}


def check_hf_state(state, canonical_shapes, model_type: str, where: str) -> None:
    """One ConversionError naming every missing, unexpected or mis-shaped HF tensor."""
    found = {k: tuple(np.shape(v)) for k, v in state.items()}
    check_tree(found, expected_hf_shapes(canonical_shapes, model_type), where, what="tensor")


# ----------------------------------------------------------------------------- whole models
def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def hf_state_to_params(
    state: Mapping[str, np.ndarray],
    hf_config: Mapping[str, Any],
    config: TransformerConfig,
    kind: str,
    where: str,
) -> dict[str, Any]:
    """A Hugging Face state dict -> Flax params {'params': ...} of `config`'s model, in
    config.param_dtype. Strict: one ConversionError names every missing, unexpected or
    mis-shaped HF tensor."""
    model_type = hf_config["model_type"]
    flax_shapes = {p: shape for p, (shape, _) in expected_param_shapes(config, kind).items()}
    canonical_shapes = {
        flax_path_to_torch_key(p): tuple(s[::-1]) if is_transposed(p) else tuple(s)
        for p, s in flax_shapes.items()
    }
    table = lambda: sinusoidal_table(config.max_len, config.d_model, "halves")  # noqa: E731
    state = normalize_hf_state(state, hf_config, where, marian_table=table)
    check_hf_state(state, canonical_shapes, model_type, where)
    dtype = numpy_dtype(config.param_dtype)
    canonical = {k: v.astype(dtype) for k, v in hf_to_canonical(state, model_type).items()}
    return torch_state_to_params(canonical, flax_shapes, where)


def params_to_hf_state(params: Mapping[str, Any], model_type: str) -> dict[str, np.ndarray]:
    """Flax params -> the Hugging Face state dict save_pretrained would write for them."""
    state = canonical_to_hf(flax_to_torch_state(params), model_type)
    return {k: np.ascontiguousarray(v) for k, v in state.items()}
