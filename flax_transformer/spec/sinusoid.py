"""The paper's sinusoidal position table, computed once in float64 for both frameworks."""

from __future__ import annotations

import numpy as np


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """(max_len, d_model) table: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    Computed in float64 numpy so both frameworks start from the same constants.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]
    div_term = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-np.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term[: d_model // 2])
    return table
