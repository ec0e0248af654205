"""Bad input to the models fails at the call with a message naming the problem."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import Transformer, TransformerLM, preset

CFG = preset("tiny", max_len=8, dropout_rate=0.1)


@pytest.fixture(scope="module")
def params():
    tokens = jnp.ones((1, 4), jnp.int32)
    return Transformer(CFG).init(jax.random.key(0), tokens, tokens)


def test_sequence_longer_than_max_len(params):
    long = jnp.ones((1, 9), jnp.int32)
    with pytest.raises(ValueError, match="src has length 9, longer than the model's max_len 8"):
        Transformer(CFG).apply(params, long, jnp.ones((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="tgt has length 9"):
        Transformer(CFG).apply(params, jnp.ones((1, 3), jnp.int32), long)


def test_wrong_rank_and_dtype(params):
    with pytest.raises(ValueError, match=r"src must be \(batch, length\) token ids"):
        Transformer(CFG).apply(params, jnp.ones((4,), jnp.int32), jnp.ones((1, 3), jnp.int32))
    with pytest.raises(ValueError, match="integer token ids"):
        Transformer(CFG).apply(params, jnp.ones((1, 4)), jnp.ones((1, 3), jnp.int32))


def test_mask_that_does_not_broadcast(params):
    src = jnp.ones((2, 5), jnp.int32)
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 1, 1, 4\) does not broadcast"):
        Transformer(CFG).apply(params, src, src, src_mask=jnp.ones((2, 1, 1, 4), bool))


def test_dropout_is_active_only_when_not_deterministic(params):
    src = jnp.array([[3, 4, 5, 6]])
    model = Transformer(CFG)
    a = model.apply(params, src, src)
    b = model.apply(params, src, src)
    c = model.apply(params, src, src, deterministic=False, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))


def test_lm_rejects_too_long_input():
    model = TransformerLM(CFG)
    params = model.init(jax.random.key(0), jnp.ones((1, 2), jnp.int32))
    with pytest.raises(ValueError, match="tokens has length 12"):
        model.apply(params, jnp.ones((1, 12), jnp.int32))


def test_lists_of_rows_are_accepted_as_numpy_would(params):
    """A list of equal-length rows is what numpy accepts as a (batch, length) array: the same
    logits as the array (it was an AttributeError); ragged rows are named."""
    src, tgt = [[3, 4, 5, 6]], [[1, 7]]
    model = Transformer(CFG)
    expected = model.apply(params, np.asarray(src), np.asarray(tgt))
    np.testing.assert_array_equal(np.asarray(model.apply(params, src, tgt)), np.asarray(expected))
    with pytest.raises(ValueError, match="src must be a .* its rows have different lengths"):
        model.apply(params, [[3, 4], [5]], tgt + tgt)
    lm = TransformerLM(CFG)
    lm_params = lm.init(jax.random.key(0), jnp.ones((1, 2), jnp.int32))
    np.testing.assert_array_equal(
        np.asarray(lm.apply(lm_params, [[3, 4, 5]])),
        np.asarray(lm.apply(lm_params, np.array([[3, 4, 5]]))),
    )
