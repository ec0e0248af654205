"""Compare two sets of named intermediates and report where they start to diverge.

Each tensor gets its shape, max abs error, relative error (max abs error / max |reference|,
see numerics.error_stats) and a verdict against a relative tolerance. The first tensor out of
tolerance, in execution order, is where the divergence starts: everything computed before it
agrees, so the cause is in that sub-layer (or its inputs' weights).

Masked positions are left out by default: rows of padding tokens in sequence tensors, and in
attention weights the padding query rows and every masked (query, key) entry.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flax_transformer.parity.capture import ATTENTION_SUFFIX
from flax_transformer.spec.kinds import ENCODER, SEQ2SEQ
from flax_transformer.spec.numerics import error_stats

# Relative tolerance per computation dtype. float64 parity is ~1e-15..1e-13 (same math);
# float32 is ~1e-7..1e-6 on the models we measured, 1e-5 leaves headroom for deep stacks.
DEFAULT_TOLERANCES = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 2e-2, "float16": 5e-3}

STATUS_OK, STATUS_FAIL, STATUS_MISSING = "ok", "FAIL", "missing"


@dataclasses.dataclass(frozen=True)
class TensorComparison:
    """One compared tensor of the report: its shape, max abs and relative error, how many entries
    were compared, and its status ("ok", "FAIL" or "missing")."""

    name: str
    shape: tuple[int, ...]
    max_abs: float | None  # None when not compared
    rel: float | None
    compared: int  # number of entries compared (masked ones left out)
    status: str  # "ok" | "FAIL" | "missing"
    note: str = ""
    # Set by compare_modules: the torch module that produced the tensor (the first divergence
    # names it), the paired Flax tensor and how the pair was found (canonical/mapping/auto).
    module: str | None = None
    flax_name: str = ""
    paired_by: str = ""

    @property
    def ok(self) -> bool:
        """False only when out of tolerance ("FAIL"); a tensor missing on one side does not fail."""
        return self.status != STATUS_FAIL


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """Every compared tensor in execution order, the tolerance and dtype they were judged at, and
    (compare_modules) the diagnosis of the first divergence."""

    tensors: tuple[TensorComparison, ...]
    tol: float
    dtype: str
    masked_excluded: bool
    labels: tuple[str, str] = ("flax", "torch")  # what ran on each side
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # compare_modules: the weights and hyperparameters of the first diverging module, judged
    # (parity.diagnosis.Diagnosis: .verdict, .format_lines(), .to_dict()).
    diagnosis: Any = None

    @property
    def ok(self) -> bool:
        """Whether every tensor is within tolerance."""
        return all(t.ok for t in self.tensors)

    @property
    def failures(self) -> list[TensorComparison]:
        """The tensors out of tolerance, in execution order."""
        return [t for t in self.tensors if not t.ok]

    @property
    def first_divergence(self) -> str | None:
        """The first tensor out of tolerance; for compare_modules, the torch module's name."""
        failures = self.failures
        if not failures:
            return None
        return failures[0].name if failures[0].module is None else failures[0].module

    def __getitem__(self, name: str) -> TensorComparison:
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def summary(self) -> str:
        """One line: OK with the tensor count and tolerance, or FAIL with the count, where the
        divergence starts and the diagnosis' verdict."""
        if self.ok:
            return f"OK: all {len(self.tensors)} tensors within relative tolerance {self.tol:.0e}"
        text = (
            f"FAIL: {len(self.failures)} of {len(self.tensors)} tensors out of relative tolerance "
            f"{self.tol:.0e}; the divergence starts at {self.first_divergence}"
        )
        if self.diagnosis is not None:
            text += f"; verdict: {self.diagnosis.verdict}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (nan / inf errors as the strings "nan" / "inf")."""
        return {
            "ok": self.ok,
            "first_divergence": self.first_divergence,
            "dtype": self.dtype,
            "tol": self.tol,
            "masked_excluded": self.masked_excluded,
            "labels": list(self.labels),
            **dict(self.info),
            "tensors": [
                {
                    "name": t.name,
                    "shape": list(t.shape),
                    "max_abs": _json_float(t.max_abs),
                    "rel": _json_float(t.rel),
                    "compared": t.compared,
                    "status": t.status,
                    "within_tol": t.ok,
                    "note": t.note,
                }
                | (
                    {"module": t.module, "flax": t.flax_name, "paired_by": t.paired_by}
                    if t.module is not None
                    else {}
                )
                for t in self.tensors
            ],
        } | ({"diagnosis": self.diagnosis.to_dict()} if self.diagnosis is not None else {})

    def to_json(self) -> str:
        """The report as indented JSON (see to_dict)."""
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        """Aligned plain-text table; the first divergence is marked with an arrow."""
        paired = any(t.module is not None for t in self.tensors)  # compare_modules' rows
        headers = ("#", "torch" if paired else "tensor")
        headers += ("flax", "paired by") if paired else ()
        headers += ("shape", "max abs err", "rel err", "status")
        rows = [
            (str(i), t.name)
            + ((t.flax_name or "-", t.paired_by or "-") if paired else ())
            + ("x".join(map(str, t.shape)) or "()", _fmt(t.max_abs), _fmt(t.rel), t.status)
            for i, t in enumerate(self.tensors)
        ]
        widths = [max(len(r[c]) for r in [headers, *rows]) for c in range(len(headers))]
        align = [str.rjust] + [str.ljust] * (len(headers) - 4) + [str.rjust, str.rjust, str.ljust]

        def line(cells):
            return "  ".join(a(c, w) for a, c, w in zip(align, cells, widths, strict=True))

        first = self.failures[0] if self.failures else None
        out = [
            f"parity: {self.labels[0]} vs {self.labels[1]}, {self.dtype}, relative tolerance "
            f"{self.tol:.0e}, masked positions "
            + ("excluded" if self.masked_excluded else "included"),
            line(headers).rstrip(),
            "  ".join("-" * w for w in widths),
        ]
        for t, cells in zip(self.tensors, rows, strict=True):
            text = line(cells).rstrip()
            if t is first:
                text += "  <-- divergence starts here"
            if t.note:
                text += f"  ({t.note})"
            out.append(text)
        out.append(self.summary())
        unpaired = self.info.get("flax_unpaired")
        if unpaired:
            shown = ", ".join(unpaired[:12]) + (", ..." if len(unpaired) > 12 else "")
            out.append(f"Flax values without a torch counterpart ({len(unpaired)}): {shown}")
        if self.diagnosis is not None:
            out.extend(self.diagnosis.format_lines())
        return "\n".join(out)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3e}"


def _json_float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)  # "nan" / "inf": JSON has no literal for them


# ----------------------------------------------------------------------------- masks
def _stream(name: str, model_kind: str) -> str:
    """Which token sequence a tensor's rows belong to: 'src' or 'tgt'."""
    if model_kind == ENCODER:
        return "src"
    if model_kind == SEQ2SEQ and name.startswith(("src_embedded", "encoder")):
        return "src"
    return "tgt"


def valid_entries(
    name: str, shape: tuple[int, ...], batch: Mapping[str, Any], model_kind: str, pad_id: int
) -> np.ndarray:
    """Boolean array broadcastable to `shape`: True where the entry is compared.

    Sequence tensors (batch, len, ...): rows of real tokens. Attention weights
    (batch, heads, q_len, k_len): real query rows x allowed keys (padding, causal in the
    decoder's self-attention).
    """
    real = {
        stream: np.asarray(batch[key]) != pad_id
        for stream, key in (("src", "src"), ("tgt", "tgt_in"))
        if key in batch
    }
    rows = real[_stream(name, model_kind)]  # (batch, q_len)
    if not name.endswith(ATTENTION_SUFFIX):
        return rows.reshape(rows.shape + (1,) * (len(shape) - 2))
    module = name[: -len(ATTENTION_SUFFIX)]
    if module.endswith("cross_attn"):
        keys = real["src"][:, None, None, :]
    else:
        keys = real[_stream(name, model_kind)][:, None, None, :]
        if module.startswith("decoder"):
            keys = keys & np.tril(np.ones(shape[-2:], dtype=bool))[None, None]
    return rows[:, None, :, None] & keys  # (batch, 1, q_len, k_len)


# ----------------------------------------------------------------------------- comparison
def compare_tensor(
    name: str, actual: np.ndarray, expected: np.ndarray, tol: float, valid: np.ndarray | None
) -> TensorComparison:
    """One row of the report: `actual` (left side) against `expected` (the reference)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    shape = tuple(expected.shape)
    if actual.shape != expected.shape:
        return TensorComparison(
            name,
            shape,
            None,
            None,
            0,
            STATUS_FAIL,
            f"shape mismatch: {actual.shape} vs {expected.shape}",
        )
    if valid is not None:
        select = np.broadcast_to(valid, actual.shape)
        actual, expected = actual[select], expected[select]
    actual = actual.astype(np.float64)
    expected = expected.astype(np.float64)
    finite = bool(np.all(np.isfinite(actual)) and np.all(np.isfinite(expected)))
    max_abs, rel = error_stats(actual, expected)
    ok = finite and rel <= tol
    note = "" if finite else "non-finite values"
    status = STATUS_OK if ok else STATUS_FAIL
    return TensorComparison(name, shape, max_abs, rel, int(actual.size), status, note)


def compare_captures(
    left: Mapping[str, np.ndarray],
    right: Mapping[str, np.ndarray],
    order: Sequence[str],
    *,
    tol: float,
    dtype: str,
    batch: Mapping[str, Any],
    model_kind: str,
    pad_id: int,
    exclude_masked: bool = True,
    labels: tuple[str, str] = ("flax", "torch"),
    info: Mapping[str, Any] | None = None,
) -> ParityReport:
    """Report on every name of either side, in `order` (then any names `order` lacks).

    `right` is the reference of the relative error. A name present on one side only is
    'missing' (e.g. no attention weights from a fused kernel); it is listed, not failed.
    """
    names = list(order) + [n for n in list(left) + list(right) if n not in order]
    names = list(dict.fromkeys(names))
    rows = []
    for name in names:
        if name not in left or name not in right:
            where = labels[1] if name not in right else labels[0]
            shape = np.shape(right.get(name, left.get(name)))
            rows.append(
                TensorComparison(
                    name, tuple(shape), None, None, 0, STATUS_MISSING, f"not produced by {where}"
                )
            )
            continue
        valid = None
        if exclude_masked:
            valid = valid_entries(name, np.shape(right[name]), batch, model_kind, pad_id)
        rows.append(compare_tensor(name, left[name], right[name], tol, valid))
    return ParityReport(tuple(rows), tol, dtype, exclude_masked, labels, dict(info or {}))
