"""Parity report: run the Flax model and the torch twin side by side, find the first divergence.

- `compare_models(flax_model, flax_params, torch_model, batch)`: any Flax Transformer /
  TransformerLM with its params against any torch_reference model (so one side can carry a
  modification, e.g. another LayerNorm eps or a swapped activation) -> ParityReport.
- `compare_weights(config, flax_params, torch_state, batch)`: the same from weights alone,
  at a chosen dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer.parity.capture import capture_flax, capture_torch
from flax_transformer.parity.inputs import ParityInputError, check_batch, make_batch
from flax_transformer.parity.report import DEFAULT_TOLERANCES, ParityReport, compare_captures
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import CLASS_NAMES, SEQ2SEQ, check_kind

RUN_DTYPES = ("float32", "float64")
# Fields that do not change the function computed in a deterministic forward pass (dtype is set
# by the run), so two configs differing only in them describe the same model.
RUNTIME_FIELDS = (
    "dtype",
    "param_dtype",
    "dropout_rate",
    "attention_dropout_rate",
    "remat",
    "attention_impl",
)


# ----------------------------------------------------------------------------- API
def compare_models(
    flax_model,
    flax_params: Mapping[str, Any],
    torch_model,
    batch: Mapping[str, Any],
    *,
    tol: float | None = None,
    exclude_masked: bool = True,
    labels: tuple[str, str] = ("flax", "torch"),
    info: Mapping[str, Any] | None = None,
) -> ParityReport:
    """Run both models deterministically on `batch` and compare every intermediate.

    batch: {"src": (B, S), "tgt_in": (B, T)} for a seq2seq Transformer, {"tgt_in": (B, T)} for
    a TransformerLM; int token ids padded with config.pad_id. The torch model is put in eval
    mode. The dtype is the Flax model's config.dtype; tol (relative) defaults per dtype
    (DEFAULT_TOLERANCES). The torch side is the reference of the relative error.
    """
    from flax_transformer.nn.kinds import kind_of

    config = flax_model.config
    kind = kind_of(flax_model)
    check_batch(batch, config, kind)
    dtype = config.dtype
    torch_dtypes = {str(p.dtype).removeprefix("torch.") for p in torch_model.parameters()}
    if torch_dtypes != {dtype}:
        raise ParityInputError(
            f"the Flax model computes in {dtype} but the torch model's parameters are "
            f"{sorted(torch_dtypes)}: compare like with like"
        )
    tol = DEFAULT_TOLERANCES[dtype] if tol is None else float(tol)
    if not tol > 0:
        raise ParityInputError(f"tolerance must be > 0, got {tol}")
    with highest_precision(x64=dtype == "float64"):
        flax_values = capture_flax(flax_model, flax_params, batch, kind)
        torch_values, order = capture_torch(torch_model, batch, kind)
    return compare_captures(
        flax_values,
        torch_values,
        order,
        tol=tol,
        dtype=dtype,
        batch=batch,
        model_kind=kind,
        pad_id=config.pad_id,
        exclude_masked=exclude_masked,
        labels=labels,
        info={"model": kind, "inputs": {k: list(np.shape(v)) for k, v in batch.items()}}
        | dict(info or {}),
    )


def compare_weights(
    config: TransformerConfig,
    flax_params: Mapping[str, Any],
    torch_state: Mapping[str, np.ndarray],
    batch: Mapping[str, Any] | None = None,
    *,
    model_kind: str = SEQ2SEQ,
    dtype: str = "float64",
    torch_config: TransformerConfig | None = None,
    tol: float | None = None,
    exclude_masked: bool = True,
    labels: tuple[str, str] = ("flax", "torch"),
    info: Mapping[str, Any] | None = None,
) -> ParityReport:
    """`flax_params` in the Flax model vs `torch_state` ({torch key: array}) in the torch twin.

    Both run at `dtype` (weights are cast). `torch_config` (default: `config`) lets the torch
    side run a different but weight-compatible config. batch defaults to `make_batch`.
    """
    import torch_reference
    from flax_transformer.nn.kinds import model_for

    try:
        model_kind = check_kind(model_kind)  # also reads the kind's old name
    except ValueError as err:
        raise ParityInputError(str(err)) from None
    if dtype not in RUN_DTYPES:
        raise ParityInputError(f"dtype must be one of {RUN_DTYPES}, got {dtype!r}")
    flax_config = run_config(config, dtype)
    torch_config = run_config(torch_config or config, dtype)
    if batch is None:
        batch = make_batch(flax_config, model_kind)
    params = _cast_tree(flax_params, dtype)
    flax_model = model_for(flax_config, model_kind)
    torch_model = getattr(torch_reference, CLASS_NAMES[model_kind])(torch_config)
    state = {k: np.asarray(v, dtype=dtype) for k, v in torch_state.items()}
    try:
        torch_reference.load_numpy_state(torch_model, state)
    except RuntimeError as err:  # torch's strict load: missing / unexpected / mis-shaped keys
        raise ParityInputError(f"torch state does not fit the {model_kind} config: {err}") from None
    return compare_models(
        flax_model,
        params,
        torch_model,
        batch,
        tol=tol,
        exclude_masked=exclude_masked,
        labels=labels,
        info=info,
    )


def run_config(config: TransformerConfig, dtype: str) -> TransformerConfig:
    """The config as the report runs it: `dtype` everywhere, no rematerialisation."""
    return config.replace(dtype=dtype, param_dtype=dtype, remat=False)


def _cast_tree(tree, dtype: str):
    if isinstance(tree, Mapping):
        return {k: _cast_tree(v, dtype) for k, v in tree.items()}
    return np.asarray(tree, dtype=dtype)


@contextlib.contextmanager
def highest_precision(x64: bool):
    """float32 matmuls at full precision on both sides (no TF32); x64 for float64 runs."""
    import jax
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with contextlib.ExitStack() as stack:
            if x64:
                stack.enter_context(jax.enable_x64(True))
            stack.enter_context(jax.default_matmul_precision("highest"))
            yield
    finally:
        torch.set_float32_matmul_precision(previous)
