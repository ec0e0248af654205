"""`top_k`: the k best entries of long rows, found through chunks; `jax.lax.top_k`'s answer.

Beam search picks the best 2K of K x V candidates a row (8 of 4 x 58101 for an opus-mt model
at beam 4). XLA:CPU's TopK walks every element through a partial sort; this reads the row once
for the maximum of each chunk of `CHUNK` elements (a vectorised reduction that XLA fuses with
the candidates' own arithmetic), keeps the k chunks whose maxima rank first, and sorts out
those k x CHUNK elements only (bench/NOTES.md, "Beam selection in chunks").

The answer is `jax.lax.top_k(canonical(x), k)`: values best first, ties to the lower index.
`canonical` makes -0.0 +0.0 and every NaN +NaN, so that the order is the plain float order with
NaN above everything (as torch.topk ranks them; jax.lax.top_k alone would put +0.0 above -0.0
and a NaN with its sign bit set below -inf). On canonical values a float maximum is the
maximum in that order (no -0.0 left to tie with +0.0; a NaN, always +NaN, propagates).

Why the chunks find it: give each chunk the key (its maximum, its position in the row).
Chunks are contiguous runs of the row (the last of a group, (R, G, V) below, may be short).
An element among the row's k best lies in one of the k chunks of highest key; otherwise k
other chunks each hold an element that ranks above it (the chunk's maximum is at least as
large and, when equal, sits in an earlier chunk, so at a lower index). The k chunks are laid
out in index order, so ties among them still go to the lower index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 256  # elements a chunk (1 KiB of float32); 128-1024 time the same (bench/NOTES.md)
CHUNK_RANGE = (128, 1024)
_BELOW_ALL = np.int32(-1).view(np.float32)  # -NaN: XLA's TopK ranks it last


def canonical(x: jax.Array) -> jax.Array:
    """-0.0 -> +0.0 and any NaN -> +NaN; every other value unchanged (compared by its bits:
    XLA:CPU treats subnormals as zero in arithmetic)."""
    if x.dtype != jnp.float32:
        return x
    minus_zero = jax.lax.bitcast_convert_type(x, jnp.int32) == jnp.iinfo(jnp.int32).min
    return jnp.where(jnp.isnan(x), jnp.float32(jnp.nan), jnp.where(minus_zero, jnp.float32(0), x))


def chunk_for(n: int) -> int:
    """The chunk for groups of n: a divisor of n in CHUNK_RANGE, the nearest to CHUNK (no
    short chunk, so no copy of the groups' whole chunks: 321 for 58101), else CHUNK."""
    low, high = CHUNK_RANGE
    divisors = [c for c in range(low, min(high, n) + 1) if n % c == 0]
    return min(divisors, key=lambda c: abs(c - CHUNK)) if divisors else CHUNK


def top_k(x: jax.Array, k: int, chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
    """x (R, N), or (R, G, V) taken as (R, G * V) -> (values (R, k), indices (R, k) int32 into
    the row of N or G * V), best first.

    Beam search passes its scores as (B, K, V): chunks then run along each beam's V scores, so
    the scores' arithmetic (a (V,) mask, a score per beam) fuses into the pass over them as
    plain broadcasts (on a (B, K * V) row it costs a division per element). `chunk`: elements
    a chunk, by default `chunk_for(V)`."""
    if x.ndim == 2:
        x = x[:, None, :]
    rows, groups, n = x.shape
    chunk = chunk or chunk_for(n)
    x = canonical(x)
    whole = n // chunk  # chunks that fit a group; the rest of it is one short chunk
    if x.dtype != jnp.float32 or whole * groups < 4 * k:  # short rows: nothing to save
        return jax.lax.top_k(x.reshape(rows, groups * n), k)
    chunk_max = x[:, :, : whole * chunk].reshape(rows, groups, whole, chunk).max(axis=3)
    if n > whole * chunk:
        short_max = x[:, :, whole * chunk :].max(axis=2, keepdims=True)
        chunk_max = jnp.concatenate([chunk_max, short_max], axis=2)
    per_group = chunk_max.shape[2]
    _, picked = jax.lax.top_k(chunk_max.reshape(rows, groups * per_group), k)  # ties: lower
    picked = jnp.sort(picked, axis=1)  # index order, so ties inside go to the lower index
    group = picked // per_group  # (R, k)
    col = (picked % per_group)[:, :, None] * chunk + jnp.arange(chunk)  # (R, k, chunk)
    # Past a group's end (its short chunk) reads -NaN, below every value canonical() leaves:
    # never among the k best, as the k chunks hold at least k real values.
    candidates = x.at[jnp.arange(rows)[:, None, None], group[:, :, None], col].get(
        mode="fill", fill_value=_BELOW_ALL
    )
    values, at = jax.lax.top_k(candidates.reshape(rows, k * chunk), k)  # (R, k)
    flat = (group[:, :, None] * n + col).reshape(rows, k * chunk)
    return values, jnp.take_along_axis(flat, at, axis=1).astype(jnp.int32)
