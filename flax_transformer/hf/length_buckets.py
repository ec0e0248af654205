"""Lengths rounded up to buckets, so an encoder compiles once per bucket and not once per length.

`HFModel.forward` of an encoder jits the model for each input shape: every new length costs a
compilation (2.6 s for a MiniLM-size BERT on the 2-core EPYC, against ~15 ms for the call
itself), so a stream of sentences of varied lengths compiles on most calls. The tokens are
padded (with the pad id, masked out) to the next bucket and the padded positions cut off again;
the padded keys are masked, so the real tokens' outputs are the same up to float rounding.

The buckets: multiples of 8 up to 32, then four per doubling (40, 48, 56, 64, 80, 96, 112,
128, 160, ...): 20 shapes per batch size up to 512 tokens, and a padded call never more than
a quarter longer than the sentence past 32 tokens (a warm 1 x 20 call padded to 32 took 1.33x
the time of the exact one; the bucket is now 24).
"""

from __future__ import annotations

import numpy as np

MIN_STEP = 8  # the finest step between buckets
BUCKETS_PER_DOUBLING = 4  # past 32 tokens: at 5/4, 6/4, 7/4 and 8/4 of a power of two


def bucket_length(length: int, max_len: int) -> int:
    """`length` rounded up to its bucket, never past max_len (nor below length)."""
    doubling = 1 << max(length - 1, 1).bit_length()  # the power of two at or above length
    step = max(MIN_STEP, doubling // (2 * BUCKETS_PER_DOUBLING))  # (doubling / 2, doubling]
    rounded = -(-length // step) * step
    return max(length, min(rounded, max_len))


def pad_columns(array: np.ndarray, length: int, value) -> np.ndarray:
    """(batch, n) -> (batch, length), the new columns `value`."""
    extra = length - array.shape[1]
    return array if extra <= 0 else np.pad(array, ((0, 0), (0, extra)), constant_values=value)
