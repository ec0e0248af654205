"""Scaled dot-product attention, multi-head attention and the boolean mask helpers.

Mask convention (the whole project): a boolean mask is True where attention is allowed,
broadcastable to (batch, heads, q_len, k_len). A query row whose keys are all masked
attends to nothing and yields zeros, never NaN. A float mask is an additive bias on the scores
(torch.nn's float masks), -inf = blocked; the torch.nn interop (interop.py) uses it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.nn.dropout import dropout
from flax_transformer.nn.layers import Dense, RMSNorm
from flax_transformer.nn.rotary import rotary_tables, rotate
from flax_transformer.spec.config import ATTENTION_IMPLS, TransformerConfig
from flax_transformer.spec.rotary import layer_rope


def make_padding_mask(tokens: jax.Array, pad_id: int) -> jax.Array:
    """(batch, len) tokens -> (batch, 1, 1, len) key mask, True on real tokens."""
    return (tokens != pad_id)[:, None, None, :]


def make_causal_mask(length: int) -> jax.Array:
    """(1, 1, length, length) lower-triangular mask: query i may see keys 0..i."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def make_segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """Packed rows: (batch, q_len) and (batch, k_len) segment ids (0 = padding) -> (batch, 1,
    q_len, k_len) mask, True where query and key belong to the same example. Padding attends
    to nothing and is attended by nothing (its rows give zeros)."""
    same = q_segments[:, :, None] == k_segments[:, None, :]
    real = (q_segments != 0)[:, :, None] & (k_segments != 0)[:, None, :]
    return (same & real)[:, None]


def window_mask(q_len: int, k_len: int, offset, window: int) -> jax.Array:
    """(1, 1, q_len, k_len): True where key slot k lies within the `window` slots ending at
    query slot offset + q (k > q - window; transformers' sliding_window_overlay). With the
    causal mask it leaves each query its `window` latest keys."""
    query = offset + jnp.arange(q_len)[:, None]
    return (jnp.arange(k_len)[None, :] > query - window)[None, None]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the given masks (None entries are skipped); None if none given."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0].astype(bool)
    for mask in present[1:]:
        combined = jnp.logical_and(combined, mask.astype(bool))
    return combined


@jax.custom_jvp
def softmax(x: jax.Array) -> jax.Array:
    """jax.nn.softmax over the last axis (the same forward values), differentiated as
    y * (dx - sum(y * dx)), torch's softmax backward.

    jax.nn.softmax differentiates through exp / sum unless the `jax_softmax_custom_jvp` flag
    is set (off by default in this JAX): its backward then materialises a broadcast of 1 / sum
    of the whole (batch, heads, q_len, k_len) scores and makes more passes over them."""
    unnormalized = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)


@softmax.defjvp
def _softmax_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    y = softmax(x)
    return y, y * (x_dot - jnp.sum(y * x_dot, axis=-1, keepdims=True))


def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    heads_first: bool = False,
    bias: jax.Array | None = None,
    scale: bool = True,
    scale_dim: float | None = None,
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """softmax(q k^T / sqrt(d_k) + bias) v, per head (without the 1 / sqrt(d_k) when not
    `scale`, times scale_dim ** -0.5 instead when given; `bias` broadcastable to (batch,
    heads, q_len, k_len), e.g. a relative position bias, added before the mask). `softcap`:
    the scaled logits become softcap * tanh(logits / softcap) (Gemma 2), before bias and mask.

    query (batch, q_len, heads, head_dim), key/value (batch, k_len, kv_heads, head_dim), or
    (batch, kv_heads, k_len, head_dim) with heads_first (the KV cache's layout, which XLA reads
    without a transpose); kv_heads divides heads, each key / value head serving heads /
    kv_heads consecutive query heads (grouped-query attention); mask broadcastable to (batch,
    heads, q_len, k_len): boolean, True = attend; or float, added to the scores, with -inf
    entries treated as blocked (so a fully blocked row gives zeros too).
    Returns output (batch, q_len, heads, head_dim) and weights (batch, heads, q_len, k_len).
    The softmax runs in at least float32 even when the inputs are bfloat16.
    """
    batch, q_len, heads, head_dim = query.shape
    # Inference runs the products heads first, (batch, heads, len, head_dim): with the batch
    # dimensions leading XLA:CPU's batched products read contiguous rows (the encoder's
    # forward 0.81x the time at 8 x 512: bench.encoder_variants). Training keeps the
    # (batch, len, heads) einsums (heads first measured no faster in its step: bench.ab_step).
    heads_first_products = deterministic
    if heads_first_products:
        query = jnp.swapaxes(query, 1, 2)  # (batch, heads, q_len, head_dim)
        if not heads_first:
            key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
            heads_first = True
    q = "bhqd" if heads_first_products else "bqhd"
    kv = "bhkd" if heads_first else "bkhd"
    kv_heads = key.shape[1 if heads_first else 2]
    group = heads // kv_heads  # query heads per key / value head (grouped-query attention)
    if group > 1:  # head h reads key / value head h // group (transformers' repeat_kv)
        grouped_q = q.replace("h", "hg")
        if heads_first_products:
            grouped = query.reshape(batch, kv_heads, group, q_len, head_dim)
        else:
            grouped = query.reshape(batch, q_len, kv_heads, group, head_dim)
        scores = jnp.einsum(f"{grouped_q},{kv}->bhgqk", grouped, key)
        scores = scores.reshape(batch, heads, q_len, scores.shape[-1])
    else:
        scores = jnp.einsum(f"{q},{kv}->bhqk", query, key)
    if scale and scale_dim is not None:  # transformers multiplies by scalar ** -0.5
        scores = scores * np.asarray(scale_dim**-0.5, query.dtype)
    elif scale:
        scores = scores / np.sqrt(head_dim).astype(query.dtype)
    softmax_dtype = jnp.promote_types(scores.dtype, jnp.float32)
    scores = scores.astype(softmax_dtype)
    if softcap is not None:  # in the softmax's dtype: bfloat16 logits stay finite and smooth
        cap = np.asarray(softcap, softmax_dtype)
        scores = jnp.tanh(scores / cap) * cap
    if bias is not None:
        scores = scores + bias.astype(softmax_dtype)
    if mask is not None:
        if jnp.issubdtype(mask.dtype, jnp.floating):
            # A float mask is an additive bias (torch's convention); -inf marks blocked keys.
            scores = scores + mask.astype(softmax_dtype)
            mask = mask != -jnp.inf
        # finfo.min instead of -inf: a fully masked row stays finite, then is zeroed below.
        scores = jnp.where(mask, scores, jnp.finfo(softmax_dtype).min)
    weights = softmax(scores)
    if mask is not None:
        weights = jnp.where(mask, weights, 0.0)
    weights = weights.astype(query.dtype)
    attended = weights
    if not deterministic and dropout_rate > 0.0:
        attended = dropout(weights, dropout_rate, dropout_rng)
    if group > 1:
        attended = attended.reshape(batch, kv_heads, group, q_len, attended.shape[-1])
        output = jnp.einsum(f"bhgqk,{kv}->{grouped_q}", attended, value)
    else:
        output = jnp.einsum(f"bhqk,{kv}->{q}", attended, value)
    if heads_first_products:
        output = jnp.swapaxes(output.reshape(batch, heads, q_len, head_dim), 1, 2)
    return output.reshape(batch, q_len, heads, head_dim), weights


def use_fused_attention(impl: str, mask: jax.Array | None) -> bool:
    """Whether config.attention_impl `impl` takes jax.nn.dot_product_attention for this call.

    The caller keeps the explicit path when the weights are requested (the fused kernel returns
    none) or attention dropout is active (it has none). Beyond that: "reference" never fuses,
    "fused" always does, "auto" only on GPU (on CPU it measured no faster than the einsum path,
    bench/NOTES.md). Additive float masks always keep the explicit path.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if mask is not None and jnp.issubdtype(mask.dtype, jnp.floating):
        return False
    if impl == "auto":
        return jax.default_backend() == "gpu"
    return impl == "fused"


def fused_attention(query, key, value, mask=None, scale: bool = True) -> jax.Array:
    """scaled_dot_product_attention's output (no weights) through jax.nn.dot_product_attention
    (cuDNN flash attention where available). Same layout (batch, len, heads, head_dim) and
    the same mask semantics: a query row with every key masked gives zeros."""
    factor = None if scale else 1.0  # None: the kernel's 1 / sqrt(head_dim)
    if mask is None:
        return jax.nn.dot_product_attention(query, key, value, scale=factor)
    mask = mask.astype(bool).reshape((1,) * (4 - mask.ndim) + mask.shape)  # 4-D
    output = jax.nn.dot_product_attention(query, key, value, mask=mask, scale=factor)
    full = jnp.broadcast_to(mask, mask.shape[:-1] + (key.shape[1],))
    any_key = jnp.any(full, axis=-1)  # (batch|1, heads|1, q_len|1)
    any_key = jnp.swapaxes(any_key, 1, 2)[..., None]  # (batch|1, q_len|1, heads|1, 1)
    return jnp.where(any_key, output, jnp.zeros((), output.dtype))


class MultiHeadAttention(nn.Module):
    """Linear maps for Q, K, V (named query, key, value), attention per head, output map `out`.

    Self-attention when `inputs_kv` is None, cross-attention otherwise. The attention weights
    are sown into the `intermediates` collection as `attention_weights` (free unless that
    collection is mutable). config.attention_impl picks the kernel (use_fused_attention); the
    explicit path runs whenever the weights are wanted or attention dropout is active.

    With `decode=True` it keeps a key/value cache in the `cache` collection, heads first (the
    layout the attention products read as they are; (batch, len, heads, head_dim) made XLA
    transpose every layer's cache on every decoding step):
    - self-attention: `cached_key`/`cached_value` of shape (batch, heads, max_len, head_dim),
      filled from `cache_index`; a call may bring several tokens at once (prefill).
    - cross-attention: the projected keys/values of `inputs_kv` (batch, heads, src_len,
      head_dim) are stored when given and reused when `inputs_kv` is None, so the encoder
      output is projected once. The queries may hold G rows per cached row (G * batch rows,
      each row's G together, as beam search lays out its beams): the G rows share that row's
      keys/values, read once instead of copied G times.
    The cache is created by a first call with decode=True (e.g. `model.init`), whose inputs set
    its shape.
    """

    config: TransformerConfig
    causal_cache: bool = True  # in decode mode, the chunk attends causally to the cache
    # A query sees only the `sliding_window` latest keys, itself included (None: all of them):
    # by slot index, in the full forward's mask and the cache's.
    sliding_window: int | None = None

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array | None = None,
        mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
        decode: bool = False,
        is_cross: bool = False,
        bias: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """`bias` (batch | 1, heads, q_len, k_len or longer), added to the logits before the
        mask (a relative position bias; in decode mode its key axis covers the cache from
        position 0 and is cut to the cache's length). `positions` (batch | 1, q_len): where
        the queries (and the keys of a self-attention) turn with config.positional "rotary"
        (default 0..q_len - 1; the models give them, the cache's offset included)."""
        cfg = self.config
        # q/k/v map "embed" to "heads" (num_heads * head_dim, head-major: a split of that axis
        # keeps whole heads); `out` maps the concatenated heads back to "embed".
        # key / value: config.kv_heads heads (grouped-query attention).
        qkv_bias = cfg.use_bias if cfg.qkv_bias is None else cfg.qkv_bias
        dense = lambda name: Dense(  # noqa: E731
            {"out": cfg.d_model, "query": cfg.attention_dim}.get(name, cfg.kv_heads * cfg.head_dim),
            use_bias=cfg.use_bias if name == "out" else qkv_bias,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            axes=("heads", "embed") if name == "out" else ("embed", "heads"),
            name=name,
        )
        batch, q_len, _ = inputs_q.shape
        split = lambda x: x.reshape(x.shape[:2] + (-1, cfg.head_dim))  # noqa: E731
        norm = lambda name, x: (
            x
            if not cfg.qk_norm
            else RMSNorm(  # noqa: E731
                cfg.layer_norm_eps,
                cfg.dtype,
                cfg.param_dtype,
                axis="head_dim",
                weight_offset=cfg.norm_weight_offset,
                name=name,
            )(x)
        )  # config.qk_norm: over each head (Qwen3's q_norm / k_norm)

        query = norm("query_norm", split(dense("query")(inputs_q)))  # (b, q_len, heads, hd)
        heads_first = decode  # the cache's layout: (batch, heads, len, head_dim)
        if is_cross:
            key, value = self._cross_keys_values(inputs_kv, dense, split, decode)
        else:
            source = inputs_q if inputs_kv is None else inputs_kv
            key = norm("key_norm", split(dense("key")(source)))
            value = split(dense("value")(source))
            if cfg.positional == "rotary":
                if positions is None:
                    positions = jnp.arange(q_len)[None]
                rope = layer_rope(cfg, self.sliding_window is not None)
                cos, sin = rotary_tables(rope, positions, query.dtype)
                query, key = rotate(query, cos, sin), rotate(key, cos, sin)
            if decode:
                key, value, mask = self._update_self_cache(key, value, mask)
            elif self.sliding_window is not None:
                mask = combine_masks(mask, window_mask(q_len, q_len, 0, self.sliding_window))
        if bias is not None:
            k_len = key.shape[2] if heads_first else key.shape[1]
            bias = bias[..., :k_len]
        group = 1  # query rows per key row (beams sharing one cached source)
        if decode and is_cross and key.shape[0] != batch:
            query, mask, group = _group_rows(query, key, mask)

        dropout_rng = None
        if not deterministic and cfg.attention_dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        weights_wanted = self.is_mutable_collection("intermediates")
        fused = use_fused_attention(cfg.attention_impl, mask)
        # The fused kernel has no soft-capping and only the 1 / sqrt(head_dim) scale.
        plain = cfg.attention_logit_softcap is None and cfg.attention_scale_dim is None
        if fused and plain and bias is None and dropout_rng is None and not weights_wanted:
            if heads_first:  # the fused kernel takes (batch, len, heads, head_dim)
                key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
            output = fused_attention(query, key, value, mask, cfg.scale_attention_logits)
        else:
            output, weights = scaled_dot_product_attention(
                query,
                key,
                value,
                mask,
                dropout_rate=cfg.attention_dropout_rate,
                dropout_rng=dropout_rng,
                deterministic=deterministic,
                heads_first=heads_first,
                bias=bias,
                scale=cfg.scale_attention_logits,
                scale_dim=cfg.attention_scale_dim,
                softcap=cfg.attention_logit_softcap,
            )
            if group > 1:  # (b, heads, G * q, k) -> (b * G, heads, q, k)
                heads, k_len = weights.shape[1], weights.shape[-1]
                weights = weights.reshape((-1, heads, group, q_len, k_len))
                weights = jnp.swapaxes(weights, 1, 2).reshape((batch, heads, q_len, k_len))
            self.sow("intermediates", "attention_weights", weights)
        output = output.reshape(batch, q_len, cfg.attention_dim)  # concat heads (and G rows)
        return dense("out")(output)

    def _cross_keys_values(self, inputs_kv, dense, split, decode):
        if not decode:
            if inputs_kv is None:
                raise ValueError("cross-attention needs the encoder output (inputs_kv)")
            return split(dense("key")(inputs_kv)), split(dense("value")(inputs_kv))
        if inputs_kv is not None:
            key = jnp.swapaxes(split(dense("key")(inputs_kv)), 1, 2)  # (batch, heads, S, hd)
            value = jnp.swapaxes(split(dense("value")(inputs_kv)), 1, 2)
            cached_key = self.variable("cache", "cached_key", lambda: key)
            cached_value = self.variable("cache", "cached_value", lambda: value)
            cached_key.value, cached_value.value = key, value
            return key, value
        if not self.has_variable("cache", "cached_key"):
            raise ValueError(
                "cross-attention cache is empty: call once with the encoder output first"
            )
        return (
            self.get_variable("cache", "cached_key"),
            self.get_variable("cache", "cached_value"),
        )

    def _update_self_cache(self, key, value, mask):
        """Write this chunk's keys/values (batch, chunk, heads, head_dim) at cache_index; return
        the whole cache (batch, heads, max_len, head_dim) and its mask."""
        key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # heads first
        initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            # The creating call sizes the cache to its inputs and attends as usual.
            return key, value, mask
        chunk = key.shape[2]
        max_len = cached_key.value.shape[2]
        index = cache_index.value
        zero = jnp.zeros((), index.dtype)  # same index dtype as cache_index, also in x64 mode
        start = (zero, zero, index, zero)
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, start)
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, start)
        cache_index.value = index + chunk
        # Query i of the chunk sits at position index + i and sees cache positions <= that.
        key_pos = jnp.arange(max_len)[None, :]
        query_pos = index + jnp.arange(chunk)[:, None]
        visible = key_pos <= query_pos if self.causal_cache else key_pos < index + chunk
        if self.sliding_window is not None:
            visible = visible & (key_pos > query_pos - self.sliding_window)
        cache_mask = visible[None, None]  # (1, 1, chunk, max_len)
        return cached_key.value, cached_value.value, combine_masks(cache_mask, mask)


def _group_rows(query, key, mask):
    """Queries (b * G, q, heads, hd) against keys of b rows: each row's G query rows become
    G * q query positions of that row, (b, G * q, heads, hd); the mask (b * G | b | 1, 1,
    q | 1, k) follows. Returns (query, mask, G)."""
    rows, q_len = query.shape[:2]
    key_rows = key.shape[0]
    if key_rows == 0 or rows % key_rows:
        raise ValueError(
            f"attention: {rows} query rows cannot share the keys of {key_rows} rows (the "
            "query rows must be a multiple: G rows per key row)"
        )
    group = rows // key_rows
    query = query.reshape((key_rows, group * q_len) + query.shape[2:])
    if mask is not None and mask.shape[0] == rows:  # one mask per query row
        mask = jnp.broadcast_to(mask, (rows, mask.shape[1], q_len, mask.shape[3]))
        mask = mask.reshape((key_rows, group) + mask.shape[1:])  # (b, G, 1|h, q, k)
        mask = jnp.swapaxes(mask, 1, 2).reshape(
            (key_rows, mask.shape[2], group * q_len, mask.shape[-1])
        )
    return query, mask, group
