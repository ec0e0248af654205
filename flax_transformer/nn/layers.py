"""Position-wise feed-forward network, positional encodings, LayerNorm as torch defines it, and
the logical axis names every parameter declares where it is created.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer.nn.dropout import Dropout
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.relative import relative_buckets
from flax_transformer.spec.sinusoid import sinusoidal_table

# ----------------------------------------------------------------------------- logical axes
# Each param names the logical axis of each of its dimensions where it is made; the names used:
# "vocab", "embed" (d_model), "heads" (num_heads * head_dim, head-major), "mlp" (d_ff),
# "position" (max_len), "embed_out" (the output d_model of a square matrix: one name per axis),
# "labels" (a classifier's classes) and "head_count" (num_heads: a relative bias table).
# training/sharding.py maps them to mesh axes. They are attached to the params (flax's
# LogicallyPartitioned boxes) only inside `boxed_param_axes()`: everywhere else model.init
# returns the plain tree of arrays that checkpoints, converters and optimisers use.
_BOX_AXES = contextvars.ContextVar("flax_transformer_box_axes", default=False)


@contextlib.contextmanager
def boxed_param_axes() -> Iterator[None]:
    """Inside this block, model.init boxes each param with its logical axis names."""
    token = _BOX_AXES.set(True)
    try:
        yield
    finally:
        _BOX_AXES.reset(token)


def with_axes(init_fn: Callable, axes: Sequence[str | None]) -> Callable:
    """`init_fn` for a param whose dimensions have the logical names `axes` (one per dim)."""
    axes = tuple(axes)
    boxed = nn.with_logical_partitioning(init_fn, axes)

    def init(key, shape, *args, **kwargs):
        if len(shape) != len(axes):
            raise ValueError(f"param of shape {tuple(shape)} declares {len(axes)} axes {axes}")
        return (boxed if _BOX_AXES.get() else init_fn)(key, shape, *args, **kwargs)

    return init


ACTIVATION_FNS = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # exact erf form (torch's)
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),  # GPT-2's gelu_new
    "silu": jax.nn.silu,  # x * sigmoid(x), Marian's "swish"
}


def activation_fn(name: str):
    """The config's activation (spec.config.ACTIVATIONS). "gelu" is exact, not tanh."""
    if name not in ACTIVATION_FNS:
        raise ValueError(f"unknown activation {name!r}")
    return ACTIVATION_FNS[name]


class Dense(nn.Module):
    """flax.linen.Dense's params and results (kernel (in, out), bias (out,), same initialisers
    and dtype promotion), computed on the inputs flattened to (rows, in).

    Why not nn.Dense: its dot_general over a (batch, len, in) input differentiates into a weight
    gradient contracting two axes, for which XLA:CPU materialises transposed copies of the
    output gradient before the GEMM. On the (rows, in) view the weight gradient is one plain
    x^T g GEMM; that made the benchmark's train step ~11% faster (bench/NOTES.md).

    `axes` are the logical names of the kernel's (in, out) axes; the bias takes the out name.
    A model's layers always give them (None leaves the params without declared axes, which
    sharding refuses).
    """

    features: int
    use_bias: bool = True
    dtype: str | None = None
    param_dtype: str = "float32"
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    axes: tuple[str | None, str | None] | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel_init, bias_init = self.kernel_init, self.bias_init
        if self.axes is not None:
            kernel_init = with_axes(kernel_init, self.axes)
            bias_init = with_axes(bias_init, self.axes[1:])
        kernel = self.param("kernel", kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param("bias", bias_init, (self.features,), self.param_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (rows, in)
        y = jnp.matmul(rows, kernel).reshape(x.shape[:-1] + (self.features,))
        return y if bias is None else y + bias


class LayerNorm(nn.Module):
    """LayerNorm over the last axis as torch.nn.LayerNorm computes it: biased variance of the
    centred input, eps inside the sqrt, then (x - mean) * rstd * scale + bias in that order.
    Params `scale` and `bias` (flax.linen.LayerNorm's names), over the logical axis `axis`.
    Statistics run in at least float32, so bfloat16 inputs keep float32 statistics; the result
    has `dtype`.

    Written out rather than flax.linen.LayerNorm, which folds the scale into the per-row rstd
    first and so materialises a (batch, len, d_model) broadcast of it; that copy was ~2.5% of a
    CPU training step (bench/NOTES.md).
    """

    epsilon: float = 1e-5
    dtype: str | None = None
    param_dtype: str = "float32"
    use_bias: bool = True
    axis: str = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        axes = (self.axis,)
        scale = self.param(
            "scale", with_axes(nn.initializers.ones, axes), (features,), self.param_dtype
        )
        bias = None
        if self.use_bias:
            bias_init = with_axes(nn.initializers.zeros, axes)
            bias = self.param("bias", bias_init, (features,), self.param_dtype)
        stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
        centered = x.astype(stats_dtype)
        centered = centered - jnp.mean(centered, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(centered), axis=-1, keepdims=True)
        y = centered * jax.lax.rsqrt(variance + self.epsilon)  # (..., features)
        y = y * scale.astype(stats_dtype)
        if bias is not None:
            y = y + bias.astype(stats_dtype)
        out_dtype = self.dtype or jnp.promote_types(x.dtype, self.param_dtype)
        return y.astype(out_dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the last axis (T5's and Llama's layer norm): x / sqrt(mean(x^2) + eps),
    no mean subtracted, no bias; then cast to the output dtype and multiplied by `scale`, in
    that order (transformers' T5LayerNorm). The mean square runs in at least float32 (float64
    inputs keep float64). Param `scale`, over the logical axis `axis`.

    `weight_offset` (config.norm_weight_offset): the product is by 1 + scale (scale stored as
    its offset from 1, initialised to 0), taken before the cast (transformers' GemmaRMSNorm)."""

    epsilon: float = 1e-6
    dtype: str | None = None
    param_dtype: str = "float32"
    axis: str = "embed"
    weight_offset: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        start = nn.initializers.zeros if self.weight_offset else nn.initializers.ones
        init = with_axes(start, (self.axis,))
        scale = self.param("scale", init, (x.shape[-1],), self.param_dtype)
        stats = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        variance = jnp.mean(jnp.square(stats), axis=-1, keepdims=True)
        out_dtype = self.dtype or jnp.promote_types(x.dtype, self.param_dtype)
        normed = stats * jax.lax.rsqrt(variance + self.epsilon)
        if self.weight_offset:
            return (normed * (1.0 + scale.astype(stats.dtype))).astype(out_dtype)
        return scale.astype(out_dtype) * normed.astype(out_dtype)


def layer_norm(config: TransformerConfig, name: str | None = None) -> nn.Module:
    """The config's norm (config.norm_type: LayerNorm with eps, dtypes and bias, or RMSNorm)
    under `name` (None: named by the attribute holding it)."""
    if config.norm_type == "rms":
        return RMSNorm(
            epsilon=config.layer_norm_eps,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            weight_offset=config.norm_weight_offset,
            name=name,
        )
    return LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        use_bias=config.use_bias,
        name=name,
    )


class FeedForward(nn.Module):
    """Linear(d_model -> d_ff), activation, dropout, Linear(d_ff -> d_model). With
    config.gated_ffn the activation's output is multiplied by a second, linear projection
    `linear3` (d_model -> d_ff) before the dropout (T5 v1.1's wi_0 / wi_1, Llama's gate / up)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        dense = lambda features, axes, name: Dense(  # noqa: E731
            features,
            use_bias=cfg.use_bias,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            axes=axes,
            name=name,
        )
        # The hidden units are the "mlp" axis: linear1's output, linear2's input.
        hidden = activation_fn(cfg.activation)(dense(cfg.d_ff, ("embed", "mlp"), "linear1")(x))
        if cfg.gated_ffn:
            hidden = hidden * dense(cfg.d_ff, ("embed", "mlp"), "linear3")(x)
        x = hidden  # (..., d_ff)
        rate = (
            cfg.dropout_rate if cfg.activation_dropout_rate is None else cfg.activation_dropout_rate
        )
        x = Dropout(rate)(x, deterministic=deterministic)
        return dense(cfg.d_model, ("mlp", "embed"), "linear2")(x)


class PositionalEncoding(nn.Module):
    """Adds positions to (batch, len, d_model) embeddings: position p reads row
    p + config.position_offset of the table. Positions run from `offset` (a scalar), or are
    given per token as `positions` (batch, len) (left-padded prompts).

    Sinusoidal positions are a constant (config.sinusoid_layout); learned ones are the param
    `weight` (max_len + position_offset, d_model) (torch key `pos_embed.weight` when this
    module is named pos_embed).
    """

    config: TransformerConfig

    @nn.compact
    def __call__(
        self, x: jax.Array, offset: jax.Array | int = 0, positions: jax.Array | None = None
    ) -> jax.Array:
        cfg = self.config
        length = x.shape[1]
        rows = cfg.max_len + cfg.position_offset
        if cfg.positional == "learned":
            init = with_axes(nn.initializers.normal(0.02), ("position", "embed"))
            table = self.param("weight", init, (rows, cfg.d_model), cfg.param_dtype)
        else:
            constant = sinusoidal_table(rows, cfg.d_model, cfg.sinusoid_layout)
            table = jnp.asarray(constant, dtype=x.dtype)
        if positions is not None:
            vectors = jnp.take(table, positions + cfg.position_offset, axis=0)  # (b, len, d)
            return x + vectors.astype(x.dtype)
        start = offset + cfg.position_offset
        vectors = jax.lax.dynamic_slice_in_dim(table, start, length, axis=0)
        return x + vectors.astype(x.dtype)[None]


# The name of every RelativePositionBias module: its `embedding` param is a table but not an
# nn.Embed's (product_matrix leaves it out).
RELATIVE_BIAS = "relative_bias"


def product_matrix(path, value) -> str | None:
    """For a params-tree leaf (jax.tree_util key path, value): "kernel" for a Dense kernel (in,
    out), "embedding" for an nn.Embed table (vocab, in), None for anything else: the matrices
    that int8 and packed float32 products (nn.int8_products, nn.f32_products) replace."""
    name = getattr(path[-1], "key", None)
    if jnp.ndim(value) != 2 or name not in ("kernel", "embedding"):
        return None
    if any(getattr(k, "key", None) == RELATIVE_BIAS for k in path):  # a table, not an nn.Embed
        return None
    return name


class RelativePositionBias(nn.Module):
    """The relative position bias (config.relative_attention_buckets): relative positions
    (batch | 1, q_len, k_len), key minus query -> a bias (batch | 1, heads, q_len, k_len) on the
    attention logits, one learned value per bucket (spec/relative.py) and head. Param
    `embedding` (buckets, heads), transformers' `relative_attention_bias.weight`."""

    config: TransformerConfig
    bidirectional: bool = True

    @nn.compact
    def __call__(self, relative: jax.Array) -> jax.Array:
        cfg = self.config
        shape = (cfg.relative_attention_buckets, cfg.num_heads)
        init = with_axes(nn.initializers.normal(1.0), ("position", "head_count"))
        table = self.param("embedding", init, shape, cfg.param_dtype)
        buckets = relative_buckets(
            relative,
            cfg.relative_attention_buckets,
            cfg.relative_attention_max_distance,
            self.bidirectional,
            xp=jnp,
        )
        values = jnp.take(table, buckets, axis=0)  # (b, q, k, heads)
        return jnp.moveaxis(values, -1, 1).astype(cfg.dtype)


class LogitsBias(nn.Module):
    """A bias (vocab,) added to the logits after the output layer (config.final_logits_bias;
    transformers' `final_logits_bias` buffer of Marian / BART). Param `bias`."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, logits: jax.Array) -> jax.Array:
        cfg = self.config
        init = with_axes(nn.initializers.zeros, ("vocab",))
        bias = self.param("bias", init, (cfg.tgt_vocab_size,), cfg.param_dtype)
        return logits + bias.astype(logits.dtype)
