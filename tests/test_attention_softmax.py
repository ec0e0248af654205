"""attention.softmax: jax.nn.softmax's values, torch's derivative y * (dx - sum(y * dx))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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
        hessian = lambda f: jax.hessian(lambda x: f(x)[1, 2, 3])(x)  # noqa: E731
        np.testing.assert_allclose(hessian(softmax), hessian(reference), rtol=0, atol=1e-14)
