"""`top_k`: the k best entries of long rows, found through chunks; `jax.lax.top_k`'s answer.

Beam search picks the best 2K of K x V candidates a row (8 of 4 x 58101 for an opus-mt model
at beam 4). XLA:CPU's TopK walks every element through a partial sort; this reads the row once
for the maximum of each chunk of `CHUNK` elements (a vectorised reduction that XLA fuses with
the candidates' own arithmetic), keeps the k chunks whose maxima rank first, and sorts out
those k x CHUNK elements only (bench/NOTES.md, "Beam selection in chunks").

The answer is `jax.lax.top_k(canonical(x), k)`: values best first, ties to the lower index.
`canonical` makes -0.0 +0.0 and every NaN +NaN, so that the order is the plain float order with
NaN above everything (as torch.topk ranks them; jax.lax.top_k alone would put +0.0 above -0.0
and a NaN with its sign bit set below -inf). Why the chunks find it: give each chunk the key
(its maximum, its chunk index). An element among the row's k best lies in one of the k chunks
of highest key; otherwise k other chunks each hold an element that ranks above it (the chunk's
maximum is at least as large and, when equal, sits in a lower chunk, so at a lower index). The
k chunks are laid out in index order, so ties among them still go to the lower index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK = 256  # elements a chunk (1 KiB of float32); 128-1024 time the same (bench/NOTES.md)
_LOWEST = np.float32(-np.inf)  # fills the last chunk past the row's end


def canonical(x: jax.Array) -> jax.Array:
    """-0.0 -> +0.0 and any NaN -> +NaN; every other value unchanged (compared by its bits:
    XLA:CPU treats subnormals as zero in arithmetic)."""
    if x.dtype != jnp.float32:
        return x
    minus_zero = jax.lax.bitcast_convert_type(x, jnp.int32) == jnp.iinfo(jnp.int32).min
    return jnp.where(jnp.isnan(x), jnp.float32(jnp.nan), jnp.where(minus_zero, jnp.float32(0), x))


def top_k(x: jax.Array, k: int, chunk: int = CHUNK) -> tuple[jax.Array, jax.Array]:
    """x (R, N) float32 -> (values (R, k), indices (R, k) int32), best first."""
    rows, n = x.shape
    whole = n // chunk  # chunks that fit; the rest of the row is one short chunk
    x = canonical(x)
    if x.dtype != jnp.float32 or whole < 4 * k:  # short rows: nothing to save
        return jax.lax.top_k(x, k)
    chunk_max = x[:, : whole * chunk].reshape(rows, whole, chunk).max(axis=2)  # (R, whole)
    if n > whole * chunk:
        short_max = x[:, whole * chunk :].max(axis=1, keepdims=True)
        chunk_max = jnp.concatenate([chunk_max, short_max], axis=1)
    _, picked = jax.lax.top_k(chunk_max, k)  # (R, k): ties to the lower chunk
    picked = jnp.sort(picked, axis=1)  # index order, so ties inside go to the lower index
    index = (picked[:, :, None] * chunk + jnp.arange(chunk)).reshape(rows, k * chunk)
    # Past the row's end (the short chunk) reads -inf: it ranks after every real -inf, whose
    # indices are lower, and there are at least k real elements.
    candidates = jnp.take_along_axis(x, index, axis=1, mode="fill", fill_value=_LOWEST)
    values, at = jax.lax.top_k(candidates, k)  # (R, k)
    return values, jnp.take_along_axis(index, at, axis=1).astype(jnp.int32)
