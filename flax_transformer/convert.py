"""Weight conversion between the Flax tree and the torch state_dict: one naming rule.

Flax path `a/b/layers_3/c/kernel` <-> torch key `a.b.layers.3.c.weight`. Leaves: Dense `kernel`
(in, out) <-> Linear `weight` (out, in), transposed; LayerNorm `scale`, Embed `embedding` and
learned positions `weight` <-> `weight`; `bias` <-> `bias`. Conversion is strict: every missing,
unexpected or mis-shaped key is reported in one ConversionError. dtypes are kept.

Files are safetensors with the config JSON in the metadata, so a file describes itself.
This module does not import torch (only the `.pt` reader does, lazily).

CLI: python -m flax_transformer.convert IN OUT [--config CONFIG.json] [--model transformer|lm]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .config import TransformerConfig

LEAF_TO_TORCH = {
    "kernel": "weight",
    "scale": "weight",
    "embedding": "weight",
    "bias": "bias",
    "weight": "weight",
}
MODEL_KINDS = ("transformer", "lm")
FORMAT_FLAX, FORMAT_TORCH = "flax", "torch"


class ConversionError(ValueError):
    """Raised with every problem found, not just the first."""


# ----------------------------------------------------------------------------- naming rule
def flax_path_to_torch_key(path: tuple[str, ...]) -> str:
    """Canonical torch key of a Flax param path:
    ('encoder', 'layers_3', 'ffn', 'linear1', 'kernel') -> 'encoder.layers.3.ffn.linear1.weight'"""
    parts = [re.sub(r"^layers_(\d+)$", r"layers.\1", p) for p in path[:-1]]
    return ".".join(parts + [LEAF_TO_TORCH[path[-1]]])


def _is_transposed(path: tuple[str, ...]) -> bool:
    return path[-1] == "kernel"


def flatten_params(params: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Nested dict -> {path tuple: leaf}. Accepts {'params': ...} too."""
    if set(params) == {"params"}:
        params = params["params"]
    flat: dict[tuple[str, ...], Any] = {}

    def walk(node, prefix):
        for name, child in node.items():
            if isinstance(child, Mapping):
                walk(child, prefix + (name,))
            else:
                flat[prefix + (name,)] = child

    walk(params, ())
    return flat


def unflatten_params(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = leaf
    return tree


def expected_param_shapes(config: TransformerConfig, model: str = "transformer"):
    """{flax path: (shape, dtype)} of the model the config describes, without allocating it."""
    import jax
    import jax.numpy as jnp

    from .model import Transformer, TransformerLM

    tokens = jnp.zeros((1, 1), jnp.int32)
    if model == "transformer":
        module, args = Transformer(config), (tokens, tokens)
    elif model == "lm":
        module, args = TransformerLM(config), (tokens,)
    else:
        raise ValueError(f"model must be one of {MODEL_KINDS}, got {model!r}")
    abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), *args))
    return {path: (tuple(a.shape), a.dtype) for path, a in flatten_params(abstract).items()}


def infer_model_kind(keys) -> str:
    """A state with an encoder or a source embedding is seq2seq; otherwise decoder-only."""
    for key in keys:
        key = key if isinstance(key, str) else ".".join(key)
        if key.startswith(("encoder", "src_embed", "shared_embed")):
            return "transformer"
    return "lm"


def _report(problems: list[str], where: str) -> None:
    if problems:
        raise ConversionError(
            f"{where}: {len(problems)} problem(s):\n  " + "\n  ".join(sorted(problems))
        )


# ----------------------------------------------------------------------------- conversion
def torch_state_to_flax(
    state: Mapping[str, np.ndarray], config: TransformerConfig, model: str | None = None
) -> dict[str, Any]:
    """torch state_dict (numpy arrays) -> Flax params {'params': ...}, strictly checked."""
    model = model or infer_model_kind(state)
    expected = {p: shape for p, (shape, _) in expected_param_shapes(config, model).items()}
    where = f"torch state -> flax params ({model}, d_model={config.d_model})"
    return torch_state_to_params(state, expected, where)


def torch_state_to_params(
    state: Mapping[str, np.ndarray],
    expected: Mapping[tuple[str, ...], tuple[int, ...]],
    where: str = "torch state -> flax params",
) -> dict[str, Any]:
    """Convert to the Flax tree whose {path: shape} is `expected` (any module, e.g. one block)."""
    problems, flat, seen = [], {}, set()
    for path, shape in expected.items():
        key = flax_path_to_torch_key(path)
        torch_shape = tuple(shape[::-1]) if _is_transposed(path) else tuple(shape)
        if key not in state:
            problems.append(f"missing key {key!r} (expected shape {torch_shape})")
            continue
        seen.add(key)
        array = np.asarray(state[key])
        if tuple(array.shape) != torch_shape:
            problems.append(
                f"shape mismatch for {key!r}: expected {torch_shape}, found {tuple(array.shape)}"
            )
            continue
        flat[path] = array.T.copy() if _is_transposed(path) else array.copy()
    for key in set(state) - seen:
        problems.append(f"unexpected key {key!r} (shape {tuple(np.shape(state[key]))})")
    _report(problems, where)
    return {"params": unflatten_params(flat)}


def flax_to_torch_state(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Flax params (nested dict, with or without the 'params' level) -> {torch key: ndarray}."""
    state = {}
    for path, leaf in flatten_params(params).items():
        if path[-1] not in LEAF_TO_TORCH:
            raise ConversionError(f"unknown parameter leaf {'/'.join(path)!r}")
        array = np.asarray(leaf)
        state[flax_path_to_torch_key(path)] = (
            array.T.copy() if _is_transposed(path) else array.copy()
        )
    return state


def check_flax_params(params: Mapping[str, Any], config: TransformerConfig, model: str) -> None:
    """Raise one ConversionError if `params` does not have exactly the config's structure."""
    expected = expected_param_shapes(config, model)
    found = {p: tuple(np.shape(v)) for p, v in flatten_params(params).items()}
    problems = []
    for path, (shape, _) in expected.items():
        name = "/".join(path)
        if path not in found:
            problems.append(f"missing param {name!r} (expected shape {shape})")
        elif found[path] != shape:
            problems.append(f"shape mismatch for {name!r}: expected {shape}, found {found[path]}")
    for path in set(found) - set(expected):
        problems.append(f"unexpected param {'/'.join(path)!r} (shape {found[path]})")
    _report(problems, f"flax params vs config ({model}, d_model={config.d_model})")


# ----------------------------------------------------------------------------- files
_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _numpy_dtype(name: str):
    if name == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in _ST_DTYPES:
        raise ConversionError(f"unsupported safetensors dtype {name!r}")
    return np.dtype(_ST_DTYPES[name])


def save_safetensors(
    path: str | Path,
    tensors: Mapping[str, np.ndarray],
    *,
    config: TransformerConfig,
    fmt: str,
    model: str,
) -> None:
    """Write `tensors` with {'format', 'model', 'config'} in the metadata."""
    from safetensors.numpy import save_file

    metadata = {"format": fmt, "model": model, "config": config.to_json()}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata)


def load_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) from a safetensors file; bfloat16 comes back as ml_dtypes.bfloat16."""
    import safetensors

    try:
        raw = Path(path).read_bytes()
        items = safetensors.deserialize(raw)
        with safetensors.safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
    except (OSError, safetensors.SafetensorError) as err:
        raise ConversionError(f"{path}: not a readable safetensors file ({err})") from None
    tensors = {}
    for name, info in items:
        dtype = _numpy_dtype(info["dtype"])
        tensors[name] = np.frombuffer(bytearray(info["data"]), dtype=dtype).reshape(info["shape"])
    return tensors, metadata


def save_flax_params(path, params, config: TransformerConfig, model: str = "transformer") -> None:
    flat = {"/".join(p): np.asarray(v) for p, v in flatten_params(params).items()}
    save_safetensors(path, flat, config=config, fmt=FORMAT_FLAX, model=model)


def save_torch_state(path, state, config: TransformerConfig, model: str = "transformer") -> None:
    save_safetensors(path, state, config=config, fmt=FORMAT_TORCH, model=model)


def _config_from_metadata(path, metadata) -> TransformerConfig | None:
    if "config" not in metadata:
        return None
    try:
        return TransformerConfig.from_json(metadata["config"])
    except ValueError as err:
        raise ConversionError(f"{path}: config in the file's metadata is invalid: {err}") from None


def load_weights(path, config: TransformerConfig | None = None, model: str | None = None):
    """Read a weight file of either framework. Returns (format, tensors, config, model).

    `tensors` is {torch key: array} for the torch format and {flax path 'a/b/kernel': array}
    for the Flax format. `.pt`/`.pth` files are torch state_dicts loaded with
    weights_only=True (checkpoints are untrusted input); they carry no config, so one must
    be given. A config given here must equal the file's own, if it has one.
    """
    path = Path(path)
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    if path.suffix in (".pt", ".pth", ".bin"):
        tensors, metadata, fmt = _load_torch_pickle(path), {}, FORMAT_TORCH
    else:
        tensors, metadata = load_safetensors(path)
        fmt = metadata.get("format") or (
            FORMAT_FLAX if any("/" in k for k in tensors) else FORMAT_TORCH
        )
    file_config = _config_from_metadata(path, metadata)
    if config is not None and file_config is not None and config != file_config:
        diff = {
            k: (v, getattr(file_config, k))
            for k, v in config.to_dict().items()
            if getattr(file_config, k) != v
        }
        raise ConversionError(
            f"{path}: the given config differs from the file's own: "
            + ", ".join(f"{k}: given {a!r}, file {b!r}" for k, (a, b) in diff.items())
        )
    config = config or file_config
    if config is None:
        raise ConversionError(f"{path}: the file carries no config; pass one (--config)")
    model = model or metadata.get("model") or infer_model_kind(k.replace("/", ".") for k in tensors)
    return fmt, tensors, config, model


def _load_torch_pickle(path: Path) -> dict[str, np.ndarray]:
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad pickle
        raise ConversionError(f"{path}: not a loadable torch file ({err})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConversionError(f"{path}: expected a state_dict of tensors")
    from torch_reference.model import tensor_to_numpy

    return {k: tensor_to_numpy(v) for k, v in obj.items()}


def load_flax_params(path, config: TransformerConfig | None = None, model: str | None = None):
    """Any weight file -> (Flax params, config, model), converting from torch if needed."""
    fmt, tensors, config, model = load_weights(path, config, model)
    if fmt == FORMAT_TORCH:
        return torch_state_to_flax(tensors, config, model), config, model
    params = {"params": unflatten_params({tuple(k.split("/")): v for k, v in tensors.items()})}
    check_flax_params(params, config, model)
    return params, config, model


def load_torch_state(path, config: TransformerConfig | None = None, model: str | None = None):
    """Any weight file -> ({torch key: array}, config, model), strictly checked."""
    params, config, model = load_flax_params(path, config, model)
    return flax_to_torch_state(params), config, model


# ----------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.convert",
        description="Convert a torch_reference weight file (.safetensors or .pt) to a Flax "
        "safetensors file, or a Flax file back to torch keys. The direction follows the input.",
    )
    parser.add_argument("input", help="torch .safetensors/.pt or Flax .safetensors file")
    parser.add_argument("output", help="where to write the converted .safetensors file")
    parser.add_argument("--config", help="TransformerConfig JSON (needed for .pt input)")
    parser.add_argument("--model", choices=MODEL_KINDS, help="default: from the file / its keys")
    args = parser.parse_args(argv)
    try:
        config = TransformerConfig.load(args.config) if args.config else None
        fmt, _, config, model = load_weights(args.input, config, args.model)
        params, config, model = load_flax_params(args.input, config, model)
        if fmt == FORMAT_TORCH:
            save_flax_params(args.output, params, config, model)
            direction = "torch -> flax"
        else:
            save_torch_state(args.output, flax_to_torch_state(params), config, model)
            direction = "flax -> torch"
    except (ConversionError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    count = len(flatten_params(params))
    print(
        json.dumps(
            {"converted": direction, "model": model, "tensors": count, "output": str(args.output)}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
