"""Lengths rounded up to buckets, so an encoder compiles once per bucket and not once per length.

`HFModel.forward` of an encoder jits the model for each input shape: every new length costs a
compilation (2.6 s for a MiniLM-size BERT on the 2-core EPYC, against ~15 ms for the call
itself), so a stream of sentences of varied lengths compiles on most calls. Padding the tokens
to the next multiple of BUCKET (with the pad id, masked out) bounds the compilations at
max_len / BUCKET per batch size; the padded keys are masked, so the real tokens' outputs are
the same up to float rounding, and the padded positions are cut off again.
"""

from __future__ import annotations

import numpy as np

BUCKET = 16  # a multiple of 16 tokens: at most 32 shapes per batch size up to 512 tokens


def bucket_length(length: int, max_len: int) -> int:
    """`length` rounded up to a multiple of BUCKET, never past max_len (nor below length)."""
    rounded = -(-length // BUCKET) * BUCKET
    return max(length, min(rounded, max_len))


def pad_columns(array: np.ndarray, length: int, value) -> np.ndarray:
    """(batch, n) -> (batch, length), the new columns `value`."""
    extra = length - array.shape[1]
    return array if extra <= 0 else np.pad(array, ((0, 0), (0, extra)), constant_values=value)
