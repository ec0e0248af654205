"""Hugging Face state dicts (any family of hf/families/) <-> this project's canonical torch keys.

Each family's rename table (`Family.weight_renames`), read in both directions: a template such
as `model.encoder.layers.{i}.fc1.{p}` <-> `encoder.layers.{i}.ffn.linear1.{p}`. Beyond
renaming, as the family says: weights stored (in, out) (GPT-2's Conv1D, `transposed_keys`) are
transposed to Linear's (out, in), fused tensors (`fused_qkv` and `fused_ffn`: GPT-2's c_attn,
Phi-3's qkv_proj and gate_up_proj) are split into their parts; `final_logits_bias` (1, V) is
the (V,) `logits_bias.bias`. Tied weights are resolved as transformers resolves them
(`tied_groups`); keys are read as it reads them (`loaded_names`: the prefix of a base model
saved bare, old LayerNorm names), and the weights of the family's other classes the loaded
class does not use are dropped with a warning (`unused_keys`). numpy only (the expected shapes
come from the model, through jax.eval_shape); the tree check is spec/tree_check.py's.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from flax_transformer.hf.families import FAMILIES, family_for
from flax_transformer.hf.families.family import Family, FusedQKV
from flax_transformer.hf.families.marian import STORED_POSITIONS as MARIAN_POSITIONS
from flax_transformer.interop.convert import (
    expected_param_shapes,
    flax_to_torch_state,
    torch_state_to_params,
)
from flax_transformer.interop.safetensors_stream import LazyArray
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.naming import (
    LEAF_TO_TORCH,
    convert_layout,
    flatten_params,
    flax_path_to_torch_key,
    is_transposed,
)
from flax_transformer.spec.sinusoid import sinusoidal_table
from flax_transformer.spec.tree_check import ConversionError, check_tree
from flax_transformer.spec.validate import weight_problems

# The registry's tables, by model_type (kept for callers of the names this module had).
IGNORED = {t: f.ignored_keys for f in FAMILIES for t in f.model_types if f.ignored_keys}
PREFIX = {t: f.prefix for f in FAMILIES for t in f.model_types}
HEAD_KEYS = ("lm_head.weight", "final_logits_bias")
# Old spellings transformers renames in the keys of every model it loads (its "legacy"
# conversion mapping): TensorFlow's LayerNorm names, kept by bert-base-uncased's files.
LEGACY_RENAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))
# The canonical names of what a class adds over its base model (an encoder's pooler and head).
HEAD_PARAMS = ("head.", "pooler.")
__all__ = [
    "HEAD_KEYS",
    "IGNORED",
    "MARIAN_POSITIONS",
    "PREFIX",
    "canonical_to_hf",
    "check_hf_state",
    "check_hf_weights",
    "expected_hf_shapes",
    "hf_state_to_params",
    "hf_to_canonical",
    "loaded_names",
    "missing_head",
    "normalize_hf_state",
    "numpy_dtype",
    "params_to_hf_state",
    "params_to_lazy_hf_state",
    "tied_groups",
    "unused_keys",
]


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


@functools.cache
def _fused_regexes(fused: FusedQKV) -> tuple[re.Pattern, re.Pattern]:
    """(HF key, canonical key) patterns of one fused tensor of a family."""
    hf = _template_regex(fused.hf_template)
    canonical = re.escape(fused.canonical_template).replace(r"\{i\}", r"(?P<i>\d+)")
    canonical = canonical.replace(r"\{name\}", f"(?P<name>{'|'.join(fused.names)})")
    return hf, re.compile("^" + canonical.replace(r"\{p\}", r"(?P<p>weight|bias)") + "$")


def _fused_match(family: Family, key: str, side: int):
    """(the FusedQKV, its match) of `key` (side 0: an HF key, 1: a canonical one), or None."""
    for fused in family.fused:
        match = _fused_regexes(fused)[side].match(key)
        if match:
            return fused, match
    return None


def tied_groups(hf_config: Mapping[str, Any]) -> list[list[str]]:
    """Groups [source, *targets] of HF keys holding one tensor (transformers 5's
    `_tied_weights_keys`, applied only when tie_word_embeddings is true unless the family
    decides alone: Family.ties_only_when_tied)."""
    family = family_for(hf_config["model_type"])
    if family.ties_only_when_tied and not hf_config.get("tie_word_embeddings", True):
        return []
    return family.tied_groups(hf_config)


def _family_config(hf_config: str | Mapping[str, Any]) -> tuple[Family, Mapping[str, Any]]:
    """(the family, config.json) of a config.json, or of a bare model_type (a family whose
    weight names do not depend on the config)."""
    if isinstance(hf_config, str):
        hf_config = {"model_type": hf_config}
    return family_for(hf_config["model_type"]), hf_config


# ----------------------------------------------------------------------------- HF -> canonical
def loaded_names(
    state: Mapping[str, Any], family: Family, where: str = "the weights"
) -> dict[str, str]:
    """{key in the file: key as transformers loads it}: the family's prefix added to every key
    (but HEAD_KEYS) of a file whose keys all lack it (a base model saved bare, e.g. BertModel's
    `embeddings.*`), and the LEGACY_RENAMES of every model applied (bert-base-uncased's
    `LayerNorm.gamma`); ConversionError (naming `where`) when two keys would load as one."""
    bare = bool(state) and not any(k.startswith(family.prefix) for k in state)
    names = {}
    for key in state:
        name = family.prefix + key if bare and key not in HEAD_KEYS else key
        for old, new in LEGACY_RENAMES:
            name = name.replace(old, new)
        names[key] = name
    if len(set(names.values())) < len(names):
        twice = sorted(k for k in names if list(names.values()).count(names[k]) > 1)
        raise ConversionError(
            f"{where}: tensors stored twice, under old and new names: {', '.join(twice)}"
        )
    return names


def unused_keys(
    state: Mapping[str, Any],
    hf_config: Mapping[str, Any],
    expected: Collection[str],
    where: str = "the weights",
) -> list[str]:
    """The keys of `state` (as in the file) holding weights of another class of the family
    (Family.other_class_keys) that the config's class does not use: not `expected` (the HF
    keys the class loads), nor tied to a key it loads. transformers' from_pretrained leaves
    them unused (the NSP head of a BertForPreTraining file read as BertModel)."""
    family = family_for(hf_config["model_type"])
    if family.other_class_keys is None:
        return []
    tied = {k for group in tied_groups(hf_config) if set(group) & set(expected) for k in group}
    return sorted(
        key
        for key, name in loaded_names(state, family, where).items()
        if family.other_class_keys.fullmatch(name) and name not in expected and name not in tied
    )


def normalize_hf_state(
    state: Mapping[str, np.ndarray],
    hf_config: Mapping[str, Any],
    where: str,
    marian_table: Callable[[], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The state as transformers' from_pretrained sees it: the base-model prefix added where a
    base model was saved, old LayerNorm names renamed (loaded_names), ignored keys dropped,
    each tied group reduced to its source (a target stands in for a missing source, as
    transformers' symmetric tying does), stored sinusoid tables (older Marian checkpoints)
    checked against `marian_table()` (the config's table) and dropped, and a missing
    `final_logits_bias` set to zeros (transformers leaves it at its zero init)."""
    family = family_for(hf_config["model_type"], where)
    names = loaded_names(state, family, where)
    state = {names[k]: v for k, v in state.items()}
    if family.ignored_keys is not None:
        state = {k: v for k, v in state.items() if not family.ignored_keys.search(k)}
    for source, *targets in tied_groups(hf_config):
        present = [k for k in (source, *targets) if k in state]
        if present:
            state[source] = state[present[0]]
        for target in targets:
            state.pop(target, None)
    if family.stored_sinusoid_keys is not None:
        for key in [k for k in state if family.stored_sinusoid_keys.match(k)]:
            table = np.asarray(state.pop(key))
            expected = marian_table() if marian_table else None
            if expected is not None and (
                table.shape != expected.shape
                or not np.array_equal(table.astype(np.float32), expected.astype(np.float32))
            ):
                raise ConversionError(
                    f"{where}: {key} is not the sinusoidal table transformers' "
                    f"{family.name} computes (shape {table.shape}); a trained position table "
                    "is not supported"
                )
    if family.final_logits_bias and "final_logits_bias" not in state and state:
        vocab = family.target_vocab(hf_config)
        dtype = next(iter(state.values())).dtype
        state["final_logits_bias"] = np.zeros((1, vocab), dtype)
    return state


def hf_to_canonical(
    state: Mapping[str, np.ndarray], hf_config: str | Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """A normalized HF state (normalize_hf_state) -> {canonical torch key: array}; `hf_config`
    is config.json (or its model_type, where the names do not depend on the config)."""
    family, hf_config = _family_config(hf_config)
    renames = family.renames(hf_config)
    canonical = {}
    for key, value in state.items():
        if not isinstance(value, LazyArray):  # read lazily: converted when asked for
            value = np.asarray(value)
        if key == "final_logits_bias":
            canonical["logits_bias.bias"] = value.reshape(-1)
            continue
        found = _fused_match(family, key, 0)
        if found:
            fused, match = found
            layer, leaf = match["i"], match["p"]
            # along the output axis: GPT-2's (d, 3d) -> 3 x (d, d); (3d,) -> 3 x (d,)
            widths, axis = fused.widths(hf_config), fused.axis(leaf)
            if isinstance(value, LazyArray):
                pieces = value.split(widths, axis=axis)
            elif isinstance(widths, int):
                pieces = np.split(value, widths, axis=axis)
            else:
                pieces = np.split(value, np.cumsum(widths)[:-1], axis=axis)
            for name, piece in zip(fused.names, pieces, strict=True):
                if leaf == "weight" and fused.transposed:
                    piece = piece.T  # Conv1D (in, out) -> (out, in)
                target = fused.canonical_template.format(i=layer, name=name, p=leaf)
                canonical[target] = piece
            continue
        name = _rename(key, renames)
        if name is None:  # check_hf_state reports these first, with every other problem
            raise ConversionError(f"no canonical name for Hugging Face tensor {key!r}")
        if family.transposed_keys is not None and family.transposed_keys.match(key):
            value = value.T
        canonical[name] = value
    return canonical


# ----------------------------------------------------------------------------- canonical -> HF
def canonical_to_hf(state: Mapping[str, Any], hf_config: str | Mapping[str, Any]) -> dict[str, Any]:
    """{canonical torch key: array} -> the HF state dict transformers' save_pretrained writes
    (tied targets absent). Works on any arrays with .T / reshape / concatenate. `hf_config` as
    in hf_to_canonical."""
    family, hf_config = _family_config(hf_config)
    model_type = family.name
    reverse = [(target, source) for source, target in family.renames(hf_config)]
    hf: dict[str, Any] = {}
    qkv: dict[tuple[FusedQKV, str, str], dict[str, Any]] = {}
    for key, value in state.items():
        if key == "logits_bias.bias":
            hf["final_logits_bias"] = np.reshape(value, (1, -1))
            continue
        found = _fused_match(family, key, 1)
        if found:
            fused, match = found
            qkv.setdefault((fused, match["i"], match["p"]), {})[match["name"]] = value
            continue
        name = _rename(key, reverse)
        if name is None:
            raise ConversionError(f"no Hugging Face {model_type} name for parameter {key!r}")
        if family.transposed_keys is not None and family.transposed_keys.match(name):
            value = np.transpose(value)
        hf[name] = value
    for (fused, layer, leaf), parts in qkv.items():
        pieces = [parts[n] for n in fused.names]
        if leaf == "weight" and fused.transposed:
            pieces = [np.transpose(p) for p in pieces]  # (out, in) -> Conv1D (in, out)
        lazy = any(isinstance(p, LazyArray) for p in pieces)
        join = LazyArray.concatenate if lazy else np.concatenate
        hf[fused.hf_template.format(i=layer, p=leaf)] = join(pieces, axis=fused.axis(leaf))
    return hf


def expected_hf_shapes(
    canonical_shapes: Mapping[str, tuple[int, ...]], hf_config: str | Mapping[str, Any]
):
    """{HF key: shape} of the HF state a model with these canonical shapes has (shapes only:
    nothing is allocated)."""
    fake = {k: LazyArray(s, np.float32, _never_read) for k, s in canonical_shapes.items()}
    return {k: tuple(np.shape(v)) for k, v in canonical_to_hf(fake, hf_config).items()}


def _never_read() -> np.ndarray:
    raise AssertionError("a shape-only tensor was read")


_CHUNK = 1 << 20  # elements: the scratch buffers stay small and warm (no fresh pages)


def _nonfinite_count(array: np.ndarray) -> int:
    """How many nan/inf values `array` (any float dtype) holds, counted in chunks."""
    flat = array.reshape(-1)
    bfloat16 = flat.dtype.name == "bfloat16"
    if bfloat16:
        flat = flat.view(np.uint16)  # nan/inf: every exponent bit set
    bits = np.empty(min(flat.size, _CHUNK), np.uint16)
    finite = np.empty(min(flat.size, _CHUNK), np.bool_)
    bad = 0
    for start in range(0, flat.size, _CHUNK):
        part = flat[start : start + _CHUNK]
        n = part.size
        if bfloat16:
            np.bitwise_and(part, np.uint16(0x7F80), out=bits[:n])
            np.not_equal(bits[:n], np.uint16(0x7F80), out=finite[:n])
        else:
            np.isfinite(part, out=finite[:n])
        bad += n - int(np.count_nonzero(finite[:n]))
    return bad


def _finite_checked(name: str, value, problems: list[str]) -> LazyArray:
    """`value` as a LazyArray that, when read, appends to `problems` the line weight_problems
    writes for its nan/inf values (bfloat16 checked on its exponent bits: no float32 copy)."""

    def load() -> np.ndarray:
        array = np.asarray(value)
        bad = _nonfinite_count(array)
        if bad:
            problems.append(f"tensor {name!r} has {bad} non-finite value(s) (nan/inf)")
        return array

    return LazyArray(np.shape(value), value.dtype, load, getattr(value, "owned", False))


def check_hf_state(state, canonical_shapes, hf_config: str | Mapping[str, Any], where: str):
    """One ConversionError naming every missing, unexpected or mis-shaped HF tensor; when the
    class's head (or pooler) is missing, a last line says so (missing_head)."""
    found = {k: tuple(np.shape(v)) for k, v in state.items()}
    expected = expected_hf_shapes(canonical_shapes, hf_config)
    try:
        check_tree(found, expected, where, what="tensor")
    except ConversionError as err:
        family, hf_config = _family_config(hf_config)
        head = missing_head(found, expected, hf_config)
        if not head:
            raise
        renames = family.renames(hf_config)
        part = "pooler" if all(_rename(k, renames).startswith("pooler.") for k in head) else "head"
        raise ConversionError(
            f"{err}\n  config.json's architectures name {family.architecture(hf_config)}, whose "
            f"{part} the file does not hold ({', '.join(head)} missing): it was saved from "
            "another class (a base model or another head). transformers' from_pretrained would "
            "initialise these at random; hf.load loads only what the file holds: name the "
            "class the file was saved from in config.json's architectures"
        ) from None


def missing_head(
    found: Collection[str], expected: Collection[str], hf_config: Mapping[str, Any]
) -> list[str]:
    """The HF keys of the class's head and pooler (canonical `head.*`, `pooler.*`: what a
    class adds over its base model) that are expected but not found."""
    renames = _family_config(hf_config)[0].renames(hf_config)
    return sorted(
        k
        for k in expected
        if k not in found and (_rename(k, renames) or "").startswith(HEAD_PARAMS)
    )


def check_hf_weights(
    state: Mapping[str, Any], hf_config: Mapping[str, Any], where: str, values: bool = True
) -> None:
    """One ConversionError naming every tensor that is not floating point (int8, bool, ...:
    no quantization format is supported, so such a tensor would be cast and compute garbage)
    or holds nan/inf; the keys transformers ignores (buffers) are not weights. `values=False`
    reads no tensor unless a dtype is bad (the values are then checked as they are converted:
    hf_state_to_params)."""
    ignored = family_for(hf_config["model_type"], where).ignored_keys
    weights = {k: v for k, v in state.items() if ignored is None or not ignored.search(k)}
    if values or weight_problems(weights, allow_nonfinite=True):
        _raise_bad_tensors(weight_problems(weights), where)


def _raise_bad_tensors(problems: list[str], where: str) -> None:
    if problems:
        note = ""
        if any("floating point" in p for p in problems):
            note = (
                " (no quantized format is supported: save the model in float32, float16 or "
                "bfloat16)"
            )
        raise ConversionError(
            f"{where}: {len(problems)} bad tensor(s){note}; nothing was loaded:\n  "
            + "\n  ".join(problems)
        )


# ----------------------------------------------------------------------------- whole models
def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name; "bfloat16" is ml_dtypes' (numpy has none)."""
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
    mis-shaped HF tensor. The weights of the family's other classes that config.json's class
    does not use (unused_keys) are dropped first, named in one UserWarning."""
    flax_shapes = {p: shape for p, (shape, _) in expected_param_shapes(config, kind).items()}
    canonical_shapes = {
        flax_path_to_torch_key(p): tuple(s[::-1]) if is_transposed(p) else tuple(s)
        for p, s in flax_shapes.items()
    }

    def table() -> np.ndarray:  # the constant position table a file may hold (older Marian)
        return sinusoidal_table(config.max_len, config.d_model, config.sinusoid_layout)

    expected = expected_hf_shapes(canonical_shapes, hf_config)
    unused = unused_keys(state, hf_config, expected, where)
    if unused:
        warnings.warn(
            f"{where}: ignored {len(unused)} tensor(s) transformers does not use for "
            f"{family_for(hf_config['model_type']).architecture(hf_config)}: " + ", ".join(unused),
            stacklevel=3,
        )
        dropped = set(unused)
        state = {k: v for k, v in state.items() if k not in dropped}
    check_hf_weights(state, hf_config, where, values=False)
    # Each tensor is read once, when it is converted, and its values checked then (one
    # ConversionError naming every non-finite tensor at the end; nothing is returned).
    ignored = family_for(hf_config["model_type"], where).ignored_keys
    nonfinite: list[str] = []
    state = {
        k: v if ignored is not None and ignored.search(k) else _finite_checked(k, v, nonfinite)
        for k, v in state.items()
    }
    state = normalize_hf_state(state, hf_config, where, marian_table=table)
    check_hf_state(state, canonical_shapes, hf_config, where)
    dtype = numpy_dtype(config.param_dtype)
    canonical = {k: v.astype(dtype) for k, v in hf_to_canonical(state, hf_config).items()}
    params = torch_state_to_params(canonical, flax_shapes, where)
    _raise_bad_tensors(sorted(set(nonfinite)), where)
    return params


def params_to_hf_state(
    params: Mapping[str, Any], hf_config: str | Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Flax params -> the Hugging Face state dict save_pretrained would write for them
    (`hf_config`: config.json, or its model_type as in hf_to_canonical); a base model's keys
    without the family's prefix, as save_pretrained writes them (Family.saved_prefix)."""
    state = canonical_to_hf(flax_to_torch_state(params), hf_config)
    family, hf_config = _family_config(hf_config)
    prefix, cut = family.prefix, family.prefix and not family.saved_prefix(hf_config)
    return {
        (k[len(prefix) :] if cut and k.startswith(prefix) else k): np.ascontiguousarray(v)
        for k, v in state.items()
    }


def params_to_lazy_hf_state(
    params: Mapping[str, Any], hf_config: str | Mapping[str, Any]
) -> dict[str, LazyArray]:
    """params_to_hf_state as LazyArrays: each tensor is made (transposed, fused, copied) only
    when asked for, so that a writer holds one converted tensor at a time beside the params."""
    flat = flatten_params(params)
    for path in flat:
        if path[-1] not in LEAF_TO_TORCH:
            raise ConversionError(f"unknown parameter leaf {'/'.join(path)!r}")
    canonical = {
        flax_path_to_torch_key(path): convert_layout(path, LazyArray.of(leaf))
        for path, leaf in flat.items()
    }
    state = canonical_to_hf(canonical, hf_config)
    family, hf_config = _family_config(hf_config)
    prefix, cut = family.prefix, family.prefix and not family.saved_prefix(hf_config)
    return {
        (k[len(prefix) :] if cut and k.startswith(prefix) else k): LazyArray.of(v)
        for k, v in state.items()
    }
