"""Rotary position embeddings in JAX (config.positional == "rotary"): the cos / sin tables of
the tokens' positions and the rotation of queries and keys (spec/rotary.py has the rules)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.spec import rotary
from flax_transformer.spec.config import TransformerConfig


def rotary_tables(config: TransformerConfig, positions: jax.Array, dtype) -> tuple:
    """(cos, sin), each (batch | 1, len, head_dim) in `dtype`, for `positions` (batch | 1,
    len): the angles position * inv_freq computed in at least float32, the frequency pairs laid
    out as [half | half], times the attention factor. The dynamic rule's frequencies follow the
    largest position given (transformers' seq_len = max(position_ids) + 1)."""
    angle_dtype = jnp.promote_types(dtype, jnp.float32)
    if config.rope_scaling == "dynamic":
        seq_len = jnp.max(positions).astype(angle_dtype) + 1
        inv_freq = rotary.dynamic_frequencies(config, seq_len, jnp).astype(angle_dtype)
    elif config.rope_scaling == "longrope":  # the table of this call's length
        seq_len = jnp.max(positions) + 1
        inv_freq = rotary.longrope_frequencies(config, seq_len, jnp).astype(angle_dtype)
    else:
        inv_freq = jnp.asarray(rotary.inverse_frequencies(config), angle_dtype)
    angles = positions.astype(angle_dtype)[..., None] * inv_freq  # (b, len, hd / 2)
    angles = jnp.concatenate([angles, angles], axis=-1)
    factor = rotary.attention_factor(config)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.astype(dtype), sin.astype(dtype)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (batch, len, heads, head_dim) turned by (cos, sin) (batch | 1, len, rotary_dim):
    x * cos + rotate_half(x) * sin, rotate_half([a | b]) = [-b | a], on the first rotary_dim
    dims (config.rotary_fraction); the rest pass through."""
    width = cos.shape[-1]
    if width < x.shape[-1]:
        return jnp.concatenate([rotate(x[..., :width], cos, sin), x[..., width:]], axis=-1)
    half = x.shape[-1] // 2
    turned = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + turned * sin[:, :, None, :]
