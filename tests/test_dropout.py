"""The project's Dropout: 16-bit uniforms from Threefry (four per hash), quantised rate, exact
expectation, and the same statistics through the fallback for other PRNG implementations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.nn.dropout import (
    Dropout,
    drop_threshold,
    dropout,
    keep_mask,
    keep_scale,
    uniform16,
)

SHAPE = (64, 128, 96)  # 786,432 draws: the keep fraction's standard error is ~3.4e-4


def keys():
    return {
        "raw threefry": jax.random.PRNGKey(3),
        "typed threefry": jax.random.key(3),
        "rbg": jax.random.key(3, impl="rbg"),
    }


@pytest.mark.parametrize("kind", ["raw threefry", "typed threefry", "rbg"])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_fraction_matches_the_quantised_rate(kind, rate):
    keep = np.asarray(keep_mask(keys()[kind], SHAPE, rate))
    expected = 1.0 - drop_threshold(rate) / 65536
    std_err = np.sqrt(expected * (1 - expected) / keep.size)
    assert abs(keep.mean() - expected) < 5 * std_err
    # No structure along any axis: every row and column band keeps about the same share.
    for axis in range(3):
        per_slice = keep.mean(axis=tuple(a for a in range(3) if a != axis))
        assert np.all(np.abs(per_slice - expected) < 0.05)


@pytest.mark.parametrize("kind", ["raw threefry", "rbg"])
def test_uniforms_cover_16_bits_evenly_and_neighbours_are_uncorrelated(kind):
    u = np.asarray(uniform16(keys()[kind], SHAPE)).astype(np.float64)
    assert u.min() >= 0 and u.max() < 65536
    counts = np.histogram(u, bins=16, range=(0, 65536))[0]
    expected = u.size / 16
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 50  # 15 degrees of freedom: p < 1e-5 above 50
    centred = (u - u.mean()) / u.std()
    # The four words of one hash sit a quarter of the row apart; plain neighbours are adjacent.
    quarter = SHAPE[-1] // 4
    for lag in (1, quarter):
        corr = np.mean(centred[..., :-lag] * centred[..., lag:])
        assert abs(corr) < 0.01
    assert abs(np.mean(centred[:-1] * centred[1:])) < 0.01  # along rows


def test_threefry_raw_and_typed_keys_draw_the_same_mask():
    raw, typed = keys()["raw threefry"], keys()["typed threefry"]
    np.testing.assert_array_equal(keep_mask(raw, SHAPE, 0.1), keep_mask(typed, SHAPE, 0.1))


def test_draws_are_deterministic_and_keys_matter():
    key = jax.random.PRNGKey(0)
    first = np.asarray(keep_mask(key, (8, 33), 0.3))
    np.testing.assert_array_equal(first, keep_mask(key, (8, 33), 0.3))
    other = np.asarray(keep_mask(jax.random.PRNGKey(1), (8, 33), 0.3))
    assert (first != other).mean() > 0.2


@pytest.mark.parametrize("shape", [(), (5,), (3, 7), (2, 3, 1), (4, 0)])
def test_any_shape_including_ragged_last_axes(shape):
    u = uniform16(jax.random.PRNGKey(0), shape)
    assert u.shape == shape and u.dtype == jnp.uint32


def test_kept_values_are_scaled_by_the_exact_inverse_keep_probability():
    x = jnp.full(SHAPE, 2.0)
    y = np.asarray(dropout(x, 0.1, jax.random.PRNGKey(0)))
    scale = 65536 / (65536 - 6554)
    assert keep_scale(0.1) == scale
    assert set(np.unique(y)) == {0.0, np.float32(2.0 * scale)}
    assert abs(y.mean() - 2.0) < 5 * 2.0 * scale * np.sqrt(0.1 * 0.9 / y.size)


def test_rate_edges_and_bad_rates():
    x = jnp.arange(6.0).reshape(2, 3)
    key = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(dropout(x, 0.0, key), x)
    np.testing.assert_array_equal(dropout(x, 1.0, key), jnp.zeros_like(x))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="dropout rate must be in"):
            dropout(x, bad, key)


def test_module_is_identity_when_deterministic_and_draws_from_the_dropout_rng():
    x = jnp.ones((4, 16, 32))
    module = Dropout(0.5)
    assert module.init(jax.random.PRNGKey(0), x) == {}
    np.testing.assert_array_equal(module.apply({}, x, deterministic=True), x)
    a = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    b = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
    assert 0.4 < float((a == 0).mean()) < 0.6
    assert float((a != b).mean()) > 0.3
    with pytest.raises(Exception, match="dropout"):
        module.apply({}, x, deterministic=False)  # no rng given


def test_gradient_is_the_mask_times_the_scale():
    key = jax.random.PRNGKey(4)
    x = jnp.linspace(-1.0, 1.0, 2 * 50).reshape(2, 50)
    grad = jax.grad(lambda v: jnp.sum(dropout(v, 0.25, key)))(x)
    keep = np.asarray(keep_mask(key, x.shape, 0.25))
    np.testing.assert_array_equal(grad, np.where(keep, np.float32(keep_scale(0.25)), 0.0))


def test_threefry_is_bit_identical_to_jax_primitive():
    from jax.extend.random import threefry2x32_p

    from flax_transformer.nn.dropout import threefry2x32

    key = jax.random.key_data(jax.random.key(123))
    count0 = jnp.arange(4096, dtype=jnp.uint32) * np.uint32(2654435761)
    count1 = jnp.arange(4096, dtype=jnp.uint32)[::-1]
    expected = threefry2x32_p.bind(key[0], key[1], count0, count1)
    ours = jax.jit(threefry2x32)(key[0], key[1], count0, count1)
    for mine, theirs in zip(ours, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
