"""Dropout with cheap random bits: 16-bit uniforms, four per Threefry hash.

`flax.linen.Dropout` draws `jax.random.bernoulli`, one 32-bit float uniform per element, and
with partitionable Threefry (JAX's default) that is one full 20-round hash per element. On the
benchmark's 2-core CPU those hashes were ~11% of a training step (bench/NOTES.md). Here each
hash yields 64 bits = four 16-bit uniforms, which cuts the hashing 4x; with a non-Threefry key
(e.g. "rbg") `jax.random.bits` draws 32 bits that are split into two 16-bit uniforms. The
hash is JAX's Threefry-2x32 with the same key, so the masks are as random as `jax.random`'s.

The drop probability is quantised to 1/65536: an element is dropped iff its uniform u16 is
below t = round(rate * 65536), and kept ones are scaled by 65536 / (65536 - t), the inverse of
the exact keep probability, so E[dropout(x)] = x exactly. For rate 0.1 the effective rate is
0.1000061. The hash counters are (column, row) of the (rows, columns) view of the array, so
the draw is elementwise and shards like the activations do.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

UNIFORM_BITS = 16
UNIFORM_LEVELS = 2**UNIFORM_BITS


def drop_threshold(rate: float) -> int:
    """Uniform 16-bit values below this are dropped: round(rate * 65536)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"dropout rate must be in [0, 1], got {rate}")
    return round(rate * UNIFORM_LEVELS)


def keep_scale(rate: float) -> float:
    """1 / P(keep) for the quantised rate, so that dropout keeps the expectation."""
    threshold = drop_threshold(rate)
    if threshold >= UNIFORM_LEVELS:
        return 0.0
    return UNIFORM_LEVELS / (UNIFORM_LEVELS - threshold)


_THREEFRY_IMPL_NAMES = ("threefry2x32", "threefry")


def _threefry_key_data(key: jax.Array) -> jax.Array | None:
    """The uint32[2] Threefry key behind `key`, or None for another PRNG implementation."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if "threefry" not in str(jax.random.key_impl(key)):
            return None
        return jax.random.key_data(key)
    raw_threefry = jax.config.jax_default_prng_impl in _THREEFRY_IMPL_NAMES
    if raw_threefry and key.shape == (2,) and key.dtype == jnp.uint32:
        return key
    return None


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(key0, key1, count0, count1) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds), bit for bit `jax.extend.random.threefry2x32_p`.

    Written out because JAX lowers that primitive on CPU as a 5-iteration `while` loop whose
    iterations write the state back to memory; unrolled, XLA fuses the rounds with the counter
    iotas and the mask into one loop (train step 1.5-3% faster, bench/NOTES.md).
    """
    keys = (key0, key1, key0 ^ key1 ^ _KEY_PARITY)
    x0, x1 = count0 + keys[0], count1 + keys[1]
    for block in range(5):
        for rotation in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(rotation)) | (x1 >> np.uint32(32 - rotation))
            x1 = x1 ^ x0
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def uniform16(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform uint32 values in [0, 65536) of `shape`, from 64-bit Threefry hashes."""
    shape = tuple(shape)
    length = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if shape else 1
    if rows >= 2**32 or length >= 2**32:
        raise ValueError(f"dropout of shape {shape}: too many rows or columns for 32-bit counters")
    key_data = _threefry_key_data(key)
    if key_data is None:
        # Any other PRNG implementation: 32 bits per draw, split into two halves.
        columns = -(-length // 2)
        words = [jax.random.bits(key, (rows, columns), jnp.uint32)]
    else:
        columns = -(-length // 4)
        column = jax.lax.broadcasted_iota(jnp.uint32, (rows, columns), 1)
        row = jax.lax.broadcasted_iota(jnp.uint32, (rows, columns), 0)
        words = list(threefry2x32(key_data[0], key_data[1], column, row))
    # Word w's low and high halves fill quarters (halves) 2w and 2w + 1 of each row. Written
    # as a broadcast and a select rather than a concatenate, so XLA fuses it into the consumer.
    parts = 2 * len(words)
    part = jax.lax.broadcasted_iota(jnp.uint32, (rows, parts, columns), 1)
    word = words[0][:, None, :]
    for index in range(1, len(words)):
        word = jnp.where(part >= 2 * index, words[index][:, None, :], word)
    halves = (word >> ((part % 2) * 16)) & 0xFFFF  # (rows, parts, columns)
    return halves.reshape(rows, parts * columns)[:, :length].reshape(shape)


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """Boolean mask of `shape`, True (keep) with probability 1 - round(rate * 65536) / 65536."""
    threshold = drop_threshold(rate)
    return uniform16(key, shape) >= np.uint32(threshold)


def dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout: zero with probability ~rate, scale the rest so the mean is kept."""
    threshold = drop_threshold(rate)
    if threshold == 0:
        return x
    if threshold >= UNIFORM_LEVELS:
        return jnp.zeros_like(x)
    keep = keep_mask(key, x.shape, rate)
    return jnp.where(keep, x * jnp.asarray(keep_scale(rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
    """Drop-in for `nn.Dropout(rate)(x, deterministic=...)`; draws from the "dropout" rng."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        if deterministic or drop_threshold(self.rate) == 0:
            return x
        return dropout(x, self.rate, self.make_rng("dropout"))
