"""The project's Dense and LayerNorm: flax.linen's params and results, computed the way that is
fast on XLA:CPU (Dense) and torch's way (LayerNorm)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer.nn.layers import Dense, LayerNorm, boxed_param_axes


@pytest.mark.parametrize("use_bias", [True, False])
def test_same_params_and_outputs_as_flax_layer_norm(use_bias):
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 16)) * 3.0 + 1.5
    ours = LayerNorm(epsilon=1e-6, use_bias=use_bias)
    stock = nn.LayerNorm(epsilon=1e-6, use_bias=use_bias, use_fast_variance=False)
    params = ours.init(jax.random.PRNGKey(1), x)
    stock_params = stock.init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, stock_params)
    params = jax.tree.map(lambda p: p + jnp.arange(p.size).reshape(p.shape) * 0.1, params)
    np.testing.assert_allclose(ours.apply(params, x), stock.apply(params, x), atol=2e-6)


def test_bfloat16_input_gives_bfloat16_output_close_to_a_float64_reference():
    x = (jax.random.normal(jax.random.PRNGKey(0), (4, 64)) * 2.0 + 5.0).astype(jnp.bfloat16)
    module = LayerNorm(dtype="bfloat16")
    params = module.init(jax.random.PRNGKey(1), x)
    y = module.apply(params, x)
    assert y.dtype == jnp.bfloat16
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    centred = x64 - x64.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
    # Only the final cast to bfloat16 (8 significant bits) is lost: |y| < 4 -> error < 2^-6.
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), expected, atol=2**-6)


@pytest.mark.parametrize("shape", [(7, 16), (3, 5, 16), (2, 3, 4, 16)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_has_flax_dense_params_and_outputs(shape, use_bias):
    x = jax.random.normal(jax.random.PRNGKey(0), shape)
    ours, stock = Dense(24, use_bias=use_bias), nn.Dense(24, use_bias=use_bias)
    params = ours.init(jax.random.PRNGKey(1), x)
    stock_params = stock.init(jax.random.PRNGKey(1), x)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(stock_params), strict=True):
        np.testing.assert_array_equal(a, b)  # same names, shapes, initialisers and values
    params = jax.tree.map(lambda p: p + 0.5, params)  # a nonzero bias too
    np.testing.assert_allclose(ours.apply(params, x), stock.apply(params, x), rtol=1e-6, atol=1e-6)
    grad = lambda m: jax.grad(lambda p: jnp.sum(m.apply(p, x) ** 2))(params)  # noqa: E731
    for a, b in zip(jax.tree.leaves(grad(ours)), jax.tree.leaves(grad(stock)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_dense_computes_in_its_dtype_with_float32_params():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
    module = Dense(4, dtype="bfloat16")
    params = module.init(jax.random.PRNGKey(1), x)
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    assert module.apply(params, x).dtype == jnp.bfloat16


def test_declared_axes_box_params_only_inside_boxed_param_axes():
    x = jnp.ones((2, 8))
    module = Dense(4, axes=("embed", "mlp"))
    plain = module.init(jax.random.PRNGKey(1), x)["params"]
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(plain))
    with boxed_param_axes():
        boxed = module.init(jax.random.PRNGKey(1), x)["params"]
    assert isinstance(boxed["kernel"], nn.LogicallyPartitioned)
    assert boxed["kernel"].names == ("embed", "mlp") and boxed["bias"].names == ("mlp",)
    np.testing.assert_array_equal(boxed["kernel"].value, plain["kernel"])  # same values
    # Outside the block init is plain again, and apply takes boxed or plain params alike.
    assert isinstance(module.init(jax.random.PRNGKey(1), x)["params"]["kernel"], jax.Array)
    np.testing.assert_array_equal(
        module.apply({"params": boxed}, x), module.apply({"params": plain}, x)
    )
