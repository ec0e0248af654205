"""Attention one sequence and one block of queries at a time: XLA:CPU's fast path for
inference with a key padding mask (BERT-family encoders).

XLA:CPU runs the explicit path's two batched products over (batch, heads) and the softmax
between them on the whole (batch, heads, q_len, k_len) scores: 8 x 12 x 512 x 512 float32 is
100 MB a layer, streamed through memory several times. Here a `lax.map` over the sequences and,
inside each, over blocks of at most QUERY_BLOCK queries computes the same attention on one
(heads, block, k_len) tile of scores at a time (1.5 MB at 12 heads x 128 x 256: it stays in the
caches), heads first (the products' batch axis leading), and divides by the softmax's sum after
the product with the values (on (block, head_dim), not on the scores). Measured on MiniLM's
shape (12 heads of 32), interleaved against scaled_dot_product_attention on the 2-core EPYC,
loaded: 0.13-0.21x its time at 32 x 128, 0.41x at 8 x 512 (docs/benchmarks/encoder.md).

The same numbers as scaled_dot_product_attention's output up to float rounding (float64: ~1e-16)
and the same mask semantics: masked keys get no weight, a query whose keys are all masked gives
zeros. It returns no weights and has no dropout, bias, soft-capping or grouped heads:
`use_blocked_attention` says when a call can take it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

QUERY_BLOCK = 128  # queries per tile of scores (a divisor of q_len, at most this many)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # bfloat16 keeps the explicit path


def query_block(q_len: int) -> int:
    """The largest divisor of q_len that is at most QUERY_BLOCK (160 -> 80, 512 -> 128)."""
    return max(b for b in range(1, min(q_len, QUERY_BLOCK) + 1) if q_len % b == 0)


def is_key_padding_mask(mask: jax.Array | None) -> bool:
    """None, or a boolean mask (batch | 1, 1, 1, k_len): one row of real keys per sequence."""
    if mask is None:
        return True
    return mask.ndim == 4 and mask.dtype == jnp.bool_ and mask.shape[1] == mask.shape[2] == 1


def _one_sequence(query, key, value, mask, scale: bool) -> jax.Array:
    """query (q_len, heads, d), key / value (k_len, heads, d), mask (k_len,) -> (q_len, heads,
    d), the queries in blocks of query_block(q_len)."""
    q_len, heads, head_dim = query.shape
    key, value = jnp.swapaxes(key, 0, 1), jnp.swapaxes(value, 0, 1)  # (heads, k_len, d)
    softmax_dtype = jnp.promote_types(query.dtype, jnp.float32)
    fill = jnp.finfo(softmax_dtype).min  # as the explicit path: finite, then zeroed below
    any_key = jnp.any(mask)

    def block(rows):  # (block, heads, d) -> the same
        scores = jnp.einsum("qhd,hkd->hqk", rows, key)
        if scale:
            scores = scores / np.sqrt(head_dim).astype(query.dtype)
        scores = jnp.where(mask, scores.astype(softmax_dtype), fill)
        unnormalized = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        total = jnp.sum(unnormalized, axis=-1)  # (heads, block)
        out = jnp.einsum("hqk,hkd->qhd", unnormalized.astype(query.dtype), value)
        factor = jnp.where(any_key, 1.0 / total, 0.0).T[..., None]  # (block, heads, 1)
        return (out * factor).astype(query.dtype)

    size = query_block(q_len)
    blocks = query.reshape(q_len // size, size, heads, head_dim)
    return jax.lax.map(block, blocks).reshape(query.shape)


def blocked_attention(query, key, value, mask=None, scale: bool = True) -> jax.Array:
    """scaled_dot_product_attention's output for query (batch, q_len, heads, head_dim), key /
    value (batch, k_len, heads, head_dim) and a key padding mask (batch | 1, 1, 1, k_len,
    True = attend; None: every key), computed a sequence and a block of queries at a time."""
    batch, k_len = key.shape[0], key.shape[1]
    if mask is None:
        mask = jnp.ones((batch, k_len), bool)
    else:
        mask = jnp.broadcast_to(mask[:, 0, 0, :], (batch, k_len))
    return jax.lax.map(
        lambda args: _one_sequence(*args, scale=scale), (query, key, value, mask)
    )


def use_blocked_attention(impl: str, query, key, mask, *, deterministic: bool) -> bool:
    """Whether a plain attention call (no weights wanted, no dropout, bias, soft-capping or
    custom scale: the caller checks those) takes blocked_attention: config.attention_impl
    "auto" on the CPU, an inference call (deterministic: training keeps the explicit path and
    its gradient), float32 / float64, as many key as query heads, a key padding mask."""
    if impl != "auto" or not deterministic or jax.default_backend() != "cpu":
        return False
    if np.dtype(query.dtype) not in DTYPES or key.shape[2] != query.shape[2]:
        return False
    return is_key_padding_mask(mask)
