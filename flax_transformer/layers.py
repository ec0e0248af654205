"""Position-wise feed-forward network, positional encodings and LayerNorm as torch defines it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .config import TransformerConfig


def activation_fn(name: str):
    """The config's activation. GELU is the exact erf form (torch's default), not tanh."""
    if name == "relu":
        return jax.nn.relu
    if name == "gelu":
        return functools.partial(jax.nn.gelu, approximate=False)
    raise ValueError(f"unknown activation {name!r}")


def layer_norm(config: TransformerConfig, name: str) -> nn.LayerNorm:
    """LayerNorm matching torch.nn.LayerNorm: biased variance, eps inside the sqrt.

    use_fast_variance=False computes E[(x - mean)^2] rather than E[x^2] - mean^2, the latter
    loses float32 parity with torch. Statistics are kept in float32 for bfloat16 inputs.
    """
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        use_fast_variance=False,
        use_bias=config.use_bias,
        name=name,
    )


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """(max_len, d_model) table: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    Computed in float64 numpy so both frameworks start from the same constants.
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]
    div_term = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-np.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(position * div_term)
    table[:, 1::2] = np.cos(position * div_term[: d_model // 2])
    return table


class FeedForward(nn.Module):
    """Linear(d_model -> d_ff), activation, dropout, Linear(d_ff -> d_model)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        dense = lambda features, name: nn.Dense(  # noqa: E731
            features,
            use_bias=cfg.use_bias,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            name=name,
        )
        x = dense(cfg.d_ff, "linear1")(x)
        x = activation_fn(cfg.activation)(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        return dense(cfg.d_model, "linear2")(x)


class PositionalEncoding(nn.Module):
    """Adds positions to (batch, len, d_model) embeddings, starting at `offset`.

    Sinusoidal positions are a constant; learned ones are the param `weight` (max_len, d_model)
    (torch key `pos_embed.weight` when this module is named pos_embed).
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, offset: jax.Array | int = 0) -> jax.Array:
        cfg = self.config
        length = x.shape[1]
        if cfg.positional == "learned":
            table = self.param(
                "weight", nn.initializers.normal(0.02), (cfg.max_len, cfg.d_model), cfg.param_dtype
            )
        else:
            table = jnp.asarray(sinusoidal_table(cfg.max_len, cfg.d_model), dtype=x.dtype)
        positions = jax.lax.dynamic_slice_in_dim(table, offset, length, axis=0)
        return x + positions.astype(x.dtype)[None]
