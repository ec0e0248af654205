"""Weight conversion between the Flax tree and the torch state_dict: one naming rule.

Flax path `a/b/layers_3/c/kernel` <-> torch key `a.b.layers.3.c.weight`. Leaves: Dense `kernel`
(in, out) <-> Linear `weight` (out, in), transposed; LayerNorm `scale`, Embed `embedding` and
learned positions `weight` <-> `weight`; `bias` <-> `bias`. Conversion is strict: every missing,
unexpected or mis-shaped key is reported in one ConversionError. dtypes are kept.

Files are safetensors with the config JSON in the metadata, so a file describes itself.
This module does not import torch (only the `.pt` reader does, lazily).

The command: `ftx convert` (cli/convert.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.files.atomic_io import atomic_path, check_output_path
from flax_transformer.files.modes import give_umask_mode
from flax_transformer.lazy import moved_names
from flax_transformer.spec.config import TransformerConfig, config_diff
from flax_transformer.spec.kinds import (
    OLD_NAMES,
    SEQ2SEQ,
    infer_model_kind,
)
from flax_transformer.spec.naming import (
    LEAF_TO_TORCH,
    convert_layout,
    flatten_params,
    flax_path_to_torch_key,
    is_transposed,
    unflatten_params,
)
from flax_transformer.spec.tree_check import ConversionError, check_tree
from flax_transformer.spec.validate import check_weights

FORMAT_FLAX, FORMAT_TORCH = "flax", "torch"


def expected_param_shapes(config: TransformerConfig, model: str = SEQ2SEQ):
    """{flax path: (shape, dtype)} of the model the config describes, without allocating it."""
    from flax_transformer.nn.kinds import abstract_variables, model_for

    abstract = abstract_variables(model_for(config, model))["params"]
    return {path: (tuple(a.shape), a.dtype) for path, a in flatten_params(abstract).items()}


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
    torch_shapes = {
        flax_path_to_torch_key(path): tuple(shape[::-1]) if is_transposed(path) else tuple(shape)
        for path, shape in expected.items()
    }
    found = {key: tuple(np.shape(value)) for key, value in state.items()}
    check_tree(found, torch_shapes, where)
    check_weights(state, where, allow_nonfinite=True)  # the dtypes; file loaders check values
    flat = {path: _own_copy(path, state[flax_path_to_torch_key(path)]) for path in expected}
    return {"params": unflatten_params(flat)}


def _own_copy(path: tuple[str, ...], value) -> np.ndarray:
    """The Flax leaf of a torch tensor: a copy, unless it is read into a buffer of its own (a
    LazyArray that says so), which is kept, made contiguous: no second copy of a big model."""
    array = convert_layout(path, np.asarray(value))
    return np.ascontiguousarray(array) if getattr(value, "owned", False) else np.array(array)


def flax_to_torch_state(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Flax params (nested dict, with or without the 'params' level) -> {torch key: ndarray}."""
    state = {}
    for path, leaf in flatten_params(params).items():
        if path[-1] not in LEAF_TO_TORCH:
            raise ConversionError(f"unknown parameter leaf {'/'.join(path)!r}")
        state[flax_path_to_torch_key(path)] = np.array(convert_layout(path, np.asarray(leaf)))
    return state


def check_flax_params(params: Mapping[str, Any], config: TransformerConfig, model: str) -> None:
    """Raise one ConversionError if `params` does not have exactly the config's structure."""
    expected = {p: shape for p, (shape, _) in expected_param_shapes(config, model).items()}
    found = {p: tuple(np.shape(v)) for p, v in flatten_params(params).items()}
    where = f"flax params vs config ({model}, d_model={config.d_model})"
    check_tree(found, expected, where, what="param", name="/".join)


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
    check_output_path(path)
    with atomic_path(path) as tmp:  # a crash mid-write leaves the old file, never half a file
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp), metadata)
        give_umask_mode(tmp)  # safetensors' own temporary file is 0600 whatever the umask


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


def save_flax_params(path, params, config: TransformerConfig, model: str = SEQ2SEQ) -> None:
    """Write a Flax params tree as safetensors, keys '/'-joined Flax paths, with format "flax",
    `model` and `config` in the metadata; the file is replaced atomically."""
    flat = {"/".join(p): np.asarray(v) for p, v in flatten_params(params).items()}
    save_safetensors(path, flat, config=config, fmt=FORMAT_FLAX, model=model)


def save_torch_state(path, state, config: TransformerConfig, model: str = SEQ2SEQ) -> None:
    """Write a torch state dict (key -> numpy array) as safetensors with format "torch", `model`
    and `config` in the metadata; the file is replaced atomically."""
    save_safetensors(path, state, config=config, fmt=FORMAT_TORCH, model=model)


def _config_from_metadata(path, metadata) -> TransformerConfig | None:
    if "config" not in metadata:
        return None
    try:
        return TransformerConfig.from_json(metadata["config"])
    except ValueError as err:
        raise ConversionError(f"{path}: config in the file's metadata is invalid: {err}") from None


def load_weights(
    path,
    config: TransformerConfig | None = None,
    model: str | None = None,
    *,
    allow_nonfinite: bool = False,
):
    """Read a weight file of either framework. Returns (format, tensors, config, model).

    `tensors` is {torch key: array} for the torch format and {flax path 'a/b/kernel': array}
    for the Flax format. `.pt`/`.pth` files are torch state_dicts loaded with
    weights_only=True (checkpoints are untrusted input); they carry no config, so one must
    be given. A config given here must equal the file's own, if it has one. Every tensor must
    be floating point and finite (unless `allow_nonfinite`); one ConversionError names the bad
    ones.
    """
    path = Path(path)
    if not path.exists():
        raise ConversionError(f"{path}: no such file")
    if path.suffix in (".pt", ".pth", ".bin"):
        tensors, metadata, fmt = load_torch_pickle(path), {}, FORMAT_TORCH
    else:
        tensors, metadata = load_safetensors(path)
        fmt = metadata.get("format") or (
            FORMAT_FLAX if any("/" in k for k in tensors) else FORMAT_TORCH
        )
    check_weights(tensors, str(path), allow_nonfinite=allow_nonfinite)
    file_config = _config_from_metadata(path, metadata)
    if config is not None and file_config is not None and config != file_config:
        diff = config_diff(config, file_config)
        raise ConversionError(
            f"{path}: the given config differs from the file's own: "
            + ", ".join(f"{k}: given {a!r}, file {b!r}" for k, (a, b) in diff.items())
        )
    config = config or file_config
    if config is None:
        raise ConversionError(f"{path}: the file carries no config; pass one (--config)")
    model = model or metadata.get("model") or infer_model_kind(k.replace("/", ".") for k in tensors)
    if model in OLD_NAMES:  # a file written before the kind was renamed
        model = OLD_NAMES[model]
    return fmt, tensors, config, model


def load_torch_pickle(path: Path) -> dict[str, np.ndarray]:
    """A torch .pt/.bin state dict (or a {"state_dict": ...} wrapper) as numpy arrays, loaded
    with weights_only=True; ConversionError if it is not loadable or holds anything but tensors."""
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


def load_flax_params(
    path,
    config: TransformerConfig | None = None,
    model: str | None = None,
    *,
    allow_nonfinite: bool = False,
):
    """Any weight file -> (Flax params, config, model), converting from torch if needed."""
    fmt, tensors, config, model = load_weights(path, config, model, allow_nonfinite=allow_nonfinite)
    if fmt == FORMAT_TORCH:
        return torch_state_to_flax(tensors, config, model), config, model
    return flax_file_params(tensors, config, model), config, model


def flax_file_params(tensors, config: TransformerConfig, model: str) -> dict[str, Any]:
    """A Flax file's {'a/b/kernel': array} as the checked params tree {'params': ...}."""
    params = {"params": unflatten_params({tuple(k.split("/")): v for k, v in tensors.items()})}
    check_flax_params(params, config, model)
    return params


def load_torch_state(
    path,
    config: TransformerConfig | None = None,
    model: str | None = None,
    *,
    allow_nonfinite: bool = False,
):
    """Any weight file -> ({torch key: array}, config, model), strictly checked."""
    params, config, model = load_flax_params(path, config, model, allow_nonfinite=allow_nonfinite)
    return flax_to_torch_state(params), config, model


# The command (`ftx convert`) moved to cli/convert.py; its names resolve from there for one
# release, with a DeprecationWarning.
__getattr__, _ = moved_names(__name__, {"main": "flax_transformer.cli.convert:main"})
