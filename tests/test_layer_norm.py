"""The project's LayerNorm: flax.linen.LayerNorm's params and results, computed torch's way."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flax_transformer.layers import LayerNorm


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
