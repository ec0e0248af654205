"""nn.blocked_attention: scaled_dot_product_attention's output a sequence and a block of
queries at a time, and the calls MultiHeadAttention routes to it (CPU inference with a key
padding mask)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flax_transformer.nn.attention as attention
from flax_transformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from flax_transformer.nn.blocked_attention import (
    blocked_attention,
    query_block,
    use_blocked_attention,
)
from flax_transformer.spec.config import TransformerConfig


def _inputs(rng, batch, length, heads=4, head_dim=8):
    return [jnp.asarray(rng.standard_normal((batch, length, heads, head_dim))) for _ in range(3)]


@pytest.mark.parametrize("batch,length", [(3, 160), (2, 256), (1, 7)])
def test_blocked_attention_equals_the_explicit_path_in_float64(batch, length):
    # 160: blocks of 80; 256: two blocks of 128; 7: one block. Sequence 0 half padding, the
    # last of three all padding (its queries give zeros on both paths).
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        query, key, value = _inputs(rng, batch, length)
        real = np.ones((batch, length), bool)
        real[0, length // 2 :] = False
        if batch == 3:
            real[2] = False
        mask = jnp.asarray(real)[:, None, None, :]
        for m in (mask, None):
            for scale in (True, False):
                expected, _ = scaled_dot_product_attention(query, key, value, m, scale=scale)
                got = jax.jit(blocked_attention, static_argnums=4)(query, key, value, m, scale)
                assert got.dtype == jnp.float64
                np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
                if batch == 3 and m is not None:  # the all-padding sequence
                    assert not np.any(np.asarray(got)[2])


def test_query_block_is_the_largest_divisor_up_to_128():
    assert [query_block(n) for n in (7, 128, 160, 192, 384, 448, 512)] == [
        7, 128, 80, 96, 128, 112, 128,
    ]  # fmt: skip


def test_use_blocked_attention_only_for_cpu_inference_with_a_key_padding_mask():
    q = jnp.zeros((2, 16, 4, 8), jnp.float32)
    padding = jnp.ones((2, 1, 1, 16), bool)
    assert use_blocked_attention("auto", q, q, padding, deterministic=True)
    assert use_blocked_attention("auto", q, q, None, deterministic=True)
    assert not use_blocked_attention("auto", q, q, padding, deterministic=False)  # training
    assert not use_blocked_attention("reference", q, q, padding, deterministic=True)
    causal = jnp.ones((1, 1, 16, 16), bool)
    assert not use_blocked_attention("auto", q, q, causal, deterministic=True)
    assert not use_blocked_attention("auto", q, q, padding.astype(jnp.float32), deterministic=True)
    assert not use_blocked_attention("auto", q, q[:, :, :2], padding, deterministic=True)  # GQA
    half = q.astype(jnp.bfloat16)
    assert not use_blocked_attention("auto", half, half, padding, deterministic=True)


@pytest.fixture(scope="module")
def tiny_attention():
    config = TransformerConfig(
        src_vocab_size=32, tgt_vocab_size=32, d_model=32, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=64, max_len=64,
    )  # fmt: skip
    layer = MultiHeadAttention(config)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 24, 32)), jnp.float32)
    params = layer.init(jax.random.PRNGKey(0), x)
    mask = jnp.asarray(np.arange(24) < np.array([[24], [10]]))[:, None, None, :]
    return layer, params, x, mask


def test_multi_head_attention_routes_inference_to_blocked_attention(tiny_attention, monkeypatch):
    layer, params, x, mask = tiny_attention
    explicit = layer.apply(params, x, mask=mask, mutable=["intermediates"])[0]  # weights wanted
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return blocked_attention(*args, **kwargs)

    monkeypatch.setattr(attention, "blocked_attention", spy)
    blocked = layer.apply(params, x, mask=mask)
    assert calls == [(2, 24, 4, 8)]
    np.testing.assert_allclose(blocked, explicit, rtol=0, atol=1e-5)
    layer.apply(params, x, mask=mask, deterministic=False)  # no dropout rng: rate 0 here
    layer.apply(params, x, mask=jnp.ones((1, 1, 24, 24), bool))  # a mask with a query axis
    assert len(calls) == 1
