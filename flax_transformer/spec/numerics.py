"""Error measures shared by the parity tests, the demo and the parity report."""

from __future__ import annotations

import numpy as np


def error_stats(actual, expected) -> tuple[float, float]:
    """(max abs error, relative error) where relative = max|a - e| / max|e|.

    The relative error is taken against the largest reference value rather than elementwise,
    so entries that happen to be near zero do not inflate it.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: {actual.shape} vs {expected.shape}")
    if actual.size == 0:
        return 0.0, 0.0
    max_abs = float(np.max(np.abs(actual - expected)))
    scale = float(np.max(np.abs(expected)))
    return max_abs, (max_abs / scale if scale > 0 else max_abs)


def assert_close(
    actual, expected, *, rtol: float | None = None, atol: float | None = None, what: str = "values"
) -> None:
    """Assert parity, with max abs and relative error in the message either way."""
    max_abs, rel = error_stats(actual, expected)
    ok = (rtol is None or rel <= rtol) and (atol is None or max_abs <= atol)
    if not ok or not np.all(np.isfinite(np.asarray(actual, dtype=np.float64))):
        raise AssertionError(
            f"{what}: max abs error {max_abs:.3e}, relative error {rel:.3e} "
            f"(rtol={rtol}, atol={atol}, shape={np.shape(expected)})"
        )
