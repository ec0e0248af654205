"""The sinusoidal position table, computed once in numpy for both frameworks."""

from __future__ import annotations

import numpy as np


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
    """(max_len, d_model) float64 table of sin/cos of pos / 10000^(2i/d) for i < d/2.

    layout "interleaved" (the paper): PE(pos, 2i) = sin(...), PE(pos, 2i+1) = cos(...).
    layout "halves" (Marian, fairseq, tensor2tensor): the sines in the first ceil(d/2) columns,
    the cosines after them. It is the table transformers' Marian builds: angles in float64 as
    `pos / np.power(10000, 2i/d)`, sin and cos rounded to float32 (transformers stores them with
    `torch.FloatTensor`, so even a float64 Marian model holds these float32 values; keeping
    them is what makes float64 parity with it possible).
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]
    if layout == "halves":
        exponent = 2 * (np.arange(d_model) // 2) / d_model  # as transformers' Marian writes it
        angles = position / np.power(10000, exponent)[None, :]  # (max_len, d_model)
        sines = np.sin(angles[:, 0::2]).astype(np.float32)
        cosines = np.cos(angles[:, 1::2]).astype(np.float32)
        return np.concatenate([sines, cosines], axis=1).astype(np.float64)
    if layout != "interleaved":
        raise ValueError(f"sinusoid layout must be 'interleaved' or 'halves', got {layout!r}")
    div_term = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-np.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term[: d_model // 2])
    return table
