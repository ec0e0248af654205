"""attention.softmax: jax.nn.softmax's values, torch's derivative y * (dx - sum(y * dx))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.nn.attention import softmax


def test_softmax_matches_jax_nn_softmax_and_its_derivatives():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((3, 5, 7)))
        x = x.at[0, 0, :3].set(jnp.finfo(jnp.float64).min)  # masked keys, as attention sets
        g = jnp.asarray(rng.standard_normal((3, 5, 7)))
        reference = lambda x: jax.nn.softmax(x, axis=-1)  # noqa: E731
        assert jnp.array_equal(softmax(x), reference(x))  # the same forward values
        grad = lambda f: jax.grad(lambda x: jnp.sum(f(x) * g))(x)  # noqa: E731
        np.testing.assert_allclose(grad(softmax), grad(reference), rtol=0, atol=1e-14)
        tangent = lambda f: jax.jvp(f, (x,), (g,))[1]  # noqa: E731
        np.testing.assert_allclose(tangent(softmax), tangent(reference), rtol=0, atol=1e-14)


# Second derivatives compile slowly (4 s idle, 27 s with the suite around it): a long run.
@pytest.mark.slow
def test_softmax_second_derivatives_match_jax_nn_softmax():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((3, 5, 7)))
        x = x.at[0, 0, :3].set(jnp.finfo(jnp.float64).min)  # masked keys, as attention sets
        reference = lambda x: jax.nn.softmax(x, axis=-1)  # noqa: E731
        hessian = lambda f: jax.hessian(lambda x: f(x)[1, 2, 3])(x)  # noqa: E731
        np.testing.assert_allclose(hessian(softmax), hessian(reference), rtol=0, atol=1e-14)


def _reference_attention(q, k, v, mask):
    """numpy: q (b, q, h, d), k / v (b, k, kv_heads, d), head h reading kv head h // group."""
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights = np.nan_to_num(weights / weights.sum(-1, keepdims=True))  # a blocked row: 0
    return np.einsum("bhqk,bkhd->bqhd", weights, v), weights


def test_inference_and_training_layouts_compute_the_same_attention():
    """Inference (deterministic) runs the products heads first, training in (batch, len,
    heads): both the reference attention in float64, for grouped queries, the cache's
    heads-first keys and a row with no key to attend to."""
    from flax_transformer.nn.attention import scaled_dot_product_attention

    rng = np.random.default_rng(1)
    with jax.enable_x64(True):
        for heads, kv_heads in ((4, 4), (4, 2)):
            q = rng.standard_normal((2, 5, heads, 8))
            k, v = (rng.standard_normal((2, 6, kv_heads, 8)) for _ in range(2))
            mask = rng.random((2, 1, 5, 6)) < 0.7
            mask[1, 0, 2] = False  # a query with every key blocked
            expected, expected_weights = _reference_attention(q, k, v, mask)
            for heads_first in (False, True):
                kk, vv = (np.swapaxes(x, 1, 2) if heads_first else x for x in (k, v))
                for deterministic in (True, False):  # (no dropout: the same function)
                    output, weights = scaled_dot_product_attention(
                        jnp.asarray(q), jnp.asarray(kk), jnp.asarray(vv), jnp.asarray(mask),
                        deterministic=deterministic, heads_first=heads_first,
                    )  # fmt: skip
                    assert output.shape == q.shape
                    np.testing.assert_allclose(output, expected, rtol=0, atol=1e-13)
                    np.testing.assert_allclose(weights, expected_weights, rtol=0, atol=1e-13)
