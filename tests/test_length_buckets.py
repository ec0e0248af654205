"""hf.length_buckets: the lengths an encoder's forward pads its tokens to."""

from __future__ import annotations

import numpy as np

from flax_transformer.hf.length_buckets import bucket_length, pad_columns


def test_buckets_are_few_and_pad_past_32_tokens_by_at_most_a_quarter():
    buckets = {n: bucket_length(n, 512) for n in range(1, 513)}
    assert all(b >= n for n, b in buckets.items())
    assert sorted(set(buckets.values()))[:8] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert len(set(buckets.values())) == 20
    assert max((buckets[n] - n) / n for n in range(33, 513)) < 0.25


def test_buckets_stop_at_max_len_and_never_shorten():
    assert bucket_length(30, 36) == 32 and bucket_length(33, 36) == 36
    assert bucket_length(40, 36) == 40  # too long for the model: left for it to refuse


def test_pad_columns_appends_the_value():
    padded = pad_columns(np.array([[1, 2], [3, 4]]), 4, 0)
    np.testing.assert_array_equal(padded, [[1, 2, 0, 0], [3, 4, 0, 0]])
    assert pad_columns(np.ones((1, 5)), 4, 0).shape == (1, 5)
