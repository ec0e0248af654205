"""Parity for any pair of models: a torch.nn.Module against a Flax linen port of it.

    report = compare_modules(torch_model, (x,), flax_model, variables, (x,))
    report.ok, report.first_divergence, report.diagnosis.verdict, print(report.format_table())
    assert_parity(...)   # the same, failing with the table (for pytest)

Both sides run once, every intermediate captured (module_capture), paired (pairing: mapping,
canonical rule, automatic fallback), compared in torch execution order at `dtype` (both sides
cast: a float64 copy of the torch module, the Flax variables cast; the user's objects are not
changed), and the first diverging module's weights judged (diagnosis).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flax_transformer.parity.compare import RUN_DTYPES, highest_precision
from flax_transformer.parity.diagnosis import diagnose
from flax_transformer.parity.inputs import ParityInputError
from flax_transformer.parity.module_capture import (
    Captured,
    capture_flax_module,
    capture_torch_module,
)
from flax_transformer.parity.pairing import NameMapping, pair_tensors
from flax_transformer.parity.report import (
    DEFAULT_TOLERANCES,
    STATUS_MISSING,
    ParityReport,
    TensorComparison,
    compare_tensor,
)
from flax_transformer.parity.transforms import Transform, transform_for
from flax_transformer.spec.numerics import error_stats

# A mask: a boolean array True where entries are compared, applied to every tensor (in the Flax
# layout) whose leading axes have its shape, e.g. (batch, length); several for several streams;
# or a callable (tensor name, shape) -> boolean array broadcastable to shape, or None.
MaskSpec = np.ndarray | Sequence[np.ndarray] | Callable[[str, tuple], Any] | None


def compare_modules(
    torch_module,
    torch_args: Sequence[Any],
    flax_module,
    variables: Mapping[str, Any],
    flax_args: Sequence[Any],
    *,
    mapping: NameMapping = None,
    dtype: str = "float64",
    rtol: float | None = None,
    transforms: Mapping[str, Transform] | None = None,
    flax_transforms: Mapping[str, Transform] | None = None,
    mask: MaskSpec = None,
    auto_pair: bool = True,
    torch_kwargs: Mapping[str, Any] | None = None,
    flax_kwargs: Mapping[str, Any] | None = None,
    labels: tuple[str, str] = ("flax", "torch"),
) -> ParityReport:
    """Run `torch_module(*torch_args)` and `flax_module.apply(variables, *flax_args)` and
    report every intermediate, in torch execution order, and the first divergence.

    mapping: None (the canonical rule, then the automatic fallback), {regex: replacement} from
    torch module names to Flax paths ('/'-separated), or a callable torch_name -> path | None.
    transforms: {regex over torch tensor/module names: transform} (see parity.transforms),
    bringing a torch tensor to the Flax layout; flax_transforms: the same for Flax tensors
    (names `path`, `path:key`; may read the module's input: transforms.minus_input).
    mask: see MaskSpec; masked entries are left out.
    rtol: relative tolerance (max |flax - torch| / max |torch|), default 1e-10 for float64 and
    1e-5 for float32. auto_pair=False leaves tensors the mapping / rule did not pair unpaired.
    Floating inputs are cast to `dtype`, integer ones kept; the torch side is the reference.
    """
    if dtype not in RUN_DTYPES:
        raise ParityInputError(f"dtype must be one of {RUN_DTYPES}, got {dtype!r}")
    tol = DEFAULT_TOLERANCES[dtype] if rtol is None else float(rtol)
    if not tol > 0:
        raise ParityInputError(f"rtol must be > 0, got {tol}")
    for what, args in (("torch_args", torch_args), ("flax_args", flax_args)):
        if not isinstance(args, (tuple, list)):
            raise ParityInputError(f"{what} must be a tuple of positional inputs, got {type(args)}")
    torch_model = _torch_at(torch_module, dtype)
    flax_model, dtype_fields = _flax_at(flax_module, dtype)
    variables = _cast_floating(variables, dtype)
    torch_values, flax_capture = _capture_both(
        torch_model,
        (torch_args, torch_kwargs),
        flax_model,
        variables,
        (flax_args, flax_kwargs),
        dtype,
    )
    torch_values, applied = _apply_transforms(torch_values, transforms, "torch")
    flax_values, flax_applied = _apply_transforms(flax_capture.values, flax_transforms, "flax")
    valid = _mask_fn(mask)
    agree = _Agreement(valid, tol)
    pairing = pair_tensors(torch_values, flax_values, mapping=mapping, auto=auto_pair, agree=agree)
    if not pairing.pairs:
        raise ParityInputError(
            f"no torch value was paired with a Flax value of the same shape "
            f"({len(torch_values)} torch, {len(flax_values)} Flax values): give a mapping, "
            "declare layout transforms, or leave auto_pair on"
        )
    rows = _rows(torch_values, pairing, tol, valid, (applied, flax_applied))
    report = ParityReport(
        tuple(rows),
        tol,
        dtype,
        masked_excluded=mask is not None,
        labels=labels,
        info={
            "paired": {
                how: sum(p.how == how for p in pairing.pairs)
                for how in ("mapping", "canonical", "auto")
            },
            "torch_only": len(pairing.torch_only),  # listed in the table as "missing"
            "flax_unpaired": [v.name for v in pairing.flax_only],
            "mapping_problems": pairing.problems,
            "flax_dtype_fields": dtype_fields,
        },
    )
    if report.ok:
        return report
    first = report.failures[0]
    flax_module_name = next(p.flax.module for p in pairing.pairs if p.torch.name == first.name)
    diagnosis = diagnose(
        torch_model,
        variables,
        flax_capture.modules,
        first.module,
        flax_module_name,
        pairing.modules,
        tol,
    )
    return dataclasses.replace(report, diagnosis=_with_unverified(diagnosis, rows))


def assert_parity(*args, **kwargs) -> ParityReport:
    """compare_modules(...) that raises AssertionError with the table when anything differs."""
    report = compare_modules(*args, **kwargs)
    if not report.ok:
        raise AssertionError("\n" + report.format_table())
    return report


# ----------------------------------------------------------------------------- helpers
def _capture_both(torch_model, torch_inputs, flax_model, variables, flax_inputs, dtype: str):
    """Both forward passes at `dtype`: (torch values, FlaxCapture); a failure names its side."""
    (torch_args, torch_kwargs), (flax_args, flax_kwargs) = torch_inputs, flax_inputs
    with highest_precision(x64=dtype == "float64"):
        torch_call = _torch_inputs(torch_args, dtype), _torch_inputs(torch_kwargs or {}, dtype)
        flax_call = _cast_floating(flax_args, dtype), _cast_floating(flax_kwargs or {}, dtype)
        try:
            torch_values = capture_torch_module(torch_model, *torch_call)
        except Exception as err:  # the user's model on the user's inputs: say which side
            raise ParityInputError(
                f"the torch module failed on torch_args / torch_kwargs: {type(err).__name__}: {err}"
            ) from err
        try:
            flax_capture = capture_flax_module(flax_model, variables, *flax_call)
        except Exception as err:
            raise ParityInputError(
                f"the Flax module failed on variables / flax_args / flax_kwargs: "
                f"{type(err).__name__}: {err}"
            ) from err
    return torch_values, flax_capture


def _rows(torch_values, pairing, tol: float, valid, applied: tuple[Mapping, Mapping]):
    """One report row per torch value, in its execution order: compared, or missing.
    `applied`: the transforms' notes by torch and by Flax tensor name."""
    torch_notes, flax_notes = applied
    rows = []
    flax_of = {id(p.torch): p for p in pairing.pairs}
    for value in torch_values:
        pair = flax_of.get(id(value))
        if pair is None:
            rows.append(_missing(value))
            continue
        flax = pair.flax
        row = compare_tensor(value.name, flax.array, value.array, tol, valid(flax.name, flax.shape))
        note = _join_notes(row.note, torch_notes.get(value.name, ""), flax_notes.get(flax.name, ""))
        rows.append(
            dataclasses.replace(
                row, module=value.module, flax_name=flax.name, paired_by=pair.how, note=note
            )
        )
    return rows


class _Agreement:
    """agree(torch value, flax value): within `tol` on the compared (unmasked) entries? The
    fallback asks this of many candidate pairs: the masked arrays and scales are cached, and
    the first entries are checked first (a difference there already exceeds the tolerance).
    """

    PROBE = 64

    def __init__(self, valid, tol: float):
        self.valid, self.tol = valid, tol
        self.keeps: dict[int, Any] = {}
        self.flat: dict[tuple[int, int], np.ndarray] = {}
        self.scales: dict[tuple[int, int], float] = {}

    def _flat(self, value: Captured, keep) -> tuple[np.ndarray, tuple[int, int]]:
        key = (id(value), id(keep))
        if key not in self.flat:
            array = value.array
            if keep is not None:
                array = array[np.broadcast_to(keep, array.shape)]
            self.flat[key] = np.asarray(array, np.float64).ravel()
        return self.flat[key], key

    def __call__(self, t: Captured, f: Captured) -> bool:
        if id(f) not in self.keeps:
            self.keeps[id(f)] = self.valid(f.name, f.shape)
        keep = self.keeps[id(f)]
        a, _ = self._flat(f, keep)
        b, key = self._flat(t, keep)
        if key not in self.scales:
            self.scales[key] = float(np.max(np.abs(b))) if b.size else 0.0
        bound = self.tol * self.scales[key] if self.scales[key] > 0 else self.tol
        probe = slice(0, self.PROBE)
        if a.size and np.max(np.abs(a[probe] - b[probe])) > bound:
            return False
        return error_stats(a, b)[1] <= self.tol


def _with_unverified(diagnosis, rows: list[TensorComparison]):
    """Torch-only tensors between the last agreeing row and the first failure."""
    first = next(i for i, r in enumerate(rows) if not r.ok)
    unverified = []
    for row in reversed(rows[:first]):
        if row.status != STATUS_MISSING:
            break
        unverified.append(row.name)
    return dataclasses.replace(diagnosis, unverified=tuple(unverified[::-1]))


def _missing(value: Captured) -> TensorComparison:
    """A torch tensor no Flax value was paired with."""
    return TensorComparison(
        value.name,
        value.shape,
        None,
        None,
        0,
        STATUS_MISSING,
        "no Flax counterpart",
        module=value.module,
    )


def _join_notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _torch_at(torch_module, dtype: str):
    """A copy of the module at `dtype`, in eval mode (the user's module is left as it was)."""
    import torch

    model = copy.deepcopy(torch_module)
    return model.to(getattr(torch, dtype)).eval()


def _flax_at(flax_module, dtype: str):
    """The module with its dtype fields (and its config's) set to `dtype`; which were set."""
    fields = {f.name for f in dataclasses.fields(flax_module)}
    updates = {k: dtype for k in ("dtype", "param_dtype") if k in fields}
    config = getattr(flax_module, "config", None)
    if "config" in fields and dataclasses.is_dataclass(config):
        config_fields = {f.name for f in dataclasses.fields(config)}
        config_updates = {k: dtype for k in ("dtype", "param_dtype") if k in config_fields}
        if config_updates:
            updates["config"] = dataclasses.replace(config, **config_updates)
    if not updates:
        return flax_module, []
    return flax_module.clone(**updates), sorted(updates)


def _is_floating(value) -> bool:
    return np.issubdtype(np.asarray(value).dtype, np.floating) or str(
        getattr(value, "dtype", "")
    ) in ("bfloat16",)


def _cast_floating(tree, dtype: str):
    """Floating arrays (numpy, JAX, nested in dicts / tuples) cast to `dtype`, others kept."""
    if isinstance(tree, Mapping):
        return {k: _cast_floating(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_cast_floating(v, dtype) for v in tree)
    if hasattr(tree, "shape") and hasattr(tree, "dtype") and not _is_torch(tree):
        array = np.asarray(tree)
        return array.astype(dtype) if _is_floating(array) else array
    if _is_torch(tree):
        raise ParityInputError("flax inputs must be numpy or JAX arrays, got a torch tensor")
    return tree


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def _torch_inputs(tree, dtype: str):
    """numpy / torch inputs as torch tensors; floating ones at `dtype`."""
    import torch

    if isinstance(tree, Mapping):
        return {k: _torch_inputs(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_torch_inputs(v, dtype) for v in tree)
    if isinstance(tree, np.ndarray) or (hasattr(tree, "shape") and not _is_torch(tree)):
        tree = torch.from_numpy(np.array(tree))
    if isinstance(tree, torch.Tensor) and tree.is_floating_point():
        return tree.to(getattr(torch, dtype))
    return tree


def _apply_transforms(
    values: list[Captured], transforms, side: str
) -> tuple[list[Captured], dict[str, str]]:
    """Each value whose name / module fully matches a regex of `transforms`, transformed."""
    if not transforms:
        return values, {}
    out, applied = [], {}
    for value in values:
        transform = transform_for(transforms, (value.name, value.module))
        if transform is None:
            out.append(value)
            continue
        try:
            if getattr(transform, "needs_input", False):
                array = np.asarray(transform(value.array, value.input))
            else:
                array = np.asarray(transform(value.array))
        except Exception as err:  # a declared transform that does not fit this tensor
            raise ParityInputError(
                f"transform {transform} failed on {side} tensor {value.name} {value.shape}: {err}"
            ) from None
        out.append(dataclasses.replace(value, array=array))
        applied[value.name] = f"{side} side: {transform}"
    return out, applied


def _mask_fn(mask: MaskSpec) -> Callable[[str, tuple], np.ndarray | None]:
    if mask is None:
        return lambda name, shape: None
    if callable(mask):
        return mask
    masks = (
        [np.asarray(mask, bool)] if hasattr(mask, "shape") else [np.asarray(m, bool) for m in mask]
    )

    def valid(_name: str, shape: tuple) -> np.ndarray | None:
        for m in masks:
            if tuple(shape[: m.ndim]) == m.shape:
                return m.reshape(m.shape + (1,) * (len(shape) - m.ndim))
        return None

    return valid
