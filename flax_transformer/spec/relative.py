"""Relative position buckets (T5's relative attention bias), as a lookup table (numpy only).

A key at position k seen from a query at position q has the relative position r = k - q. Its
bucket: bidirectional (an encoder), half the buckets for r > 0 and half for r <= 0, by |r|;
causal (a decoder), r > 0 never attends and counts as 0, the bucket is by -r. Within a
direction, distances below half its buckets are exact, the rest log-spaced up to max_distance,
and anything farther takes the last bucket.

The log is that of the float32 quotient distance / max_exact, rounded to float32, as
transformers takes it (torch's float32 log agreed with the correctly rounded one used here for
every setting parity_tests/test_relative_bias.py tries), so the boundaries fall exactly where
theirs do; since every |r| >= max_distance lands in the last bucket, the
table over r in [-max_distance, max_distance] gives every bucket: bucket(r) =
table[clip(r, -D, D) + D].
"""

from __future__ import annotations

import functools
import math

import numpy as np


@functools.cache
def relative_bucket_table(num_buckets: int, max_distance: int, bidirectional: bool) -> np.ndarray:
    """int32 (2 * max_distance + 1,): the bucket of r = -max_distance .. max_distance."""
    relative = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(np.int64) * num_buckets
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):  # log(0) for the exact distances, unused
        quotient = distance.astype(np.float32) / np.float32(max_exact)
        ratio = np.log(quotient.astype(np.float64)).astype(np.float32)  # correctly rounded
    scaled = ratio / np.float32(math.log(max_distance / max_exact))
    scaled = scaled * np.float32(num_buckets - max_exact)
    large = max_exact + np.where(distance < max_exact, 0, scaled).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    buckets += np.where(distance < max_exact, distance, large)
    return buckets.astype(np.int32)


def relative_buckets(relative, num_buckets: int, max_distance: int, bidirectional: bool, xp=np):
    """The bucket of each relative position (integers, any shape), with the array module `xp`
    (numpy, jax.numpy; torch callers index the table themselves)."""
    table = xp.asarray(relative_bucket_table(num_buckets, max_distance, bidirectional))
    return table[xp.clip(relative, -max_distance, max_distance) + max_distance]
