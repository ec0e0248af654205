"""Both models export with jax.export under symbolic (batch, length) dimensions, and the
exported function computes what the model computes, at several batch sizes and lengths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from flax_transformer import Transformer, TransformerLM, preset
from flax_transformer.nn.kinds import abstract_variables

CFG = preset("tiny")  # max_len 16


def random_variables(model, seed: int) -> dict:
    """Weights of the model's shapes drawn by numpy: no init to compile."""
    rng = np.random.default_rng(seed)
    draw = lambda s: rng.normal(0.0, 0.3, s.shape).astype(s.dtype)  # noqa: E731
    return jax.tree.map(draw, abstract_variables(model))


def tokens(rng, batch, length, vocab):
    out = rng.integers(3, vocab, (batch, length)).astype(np.int32)
    out[0, length - 2 :] = CFG.pad_id  # one padded row: the masks depend on the values
    return out


@pytest.fixture(scope="module")
def seq2seq():
    model = Transformer(CFG)
    return model, random_variables(model, seed=0)


def test_seq2seq_forward_with_symbolic_batch_and_lengths(seq2seq):
    model, variables = seq2seq
    forward = jax.jit(lambda src, tgt: model.apply(variables, src, tgt))
    b, s, t = export.symbolic_shape("b, s, t", constraints=["s <= 16", "t <= 16"])
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    exported = export.export(forward)(spec(b, s), spec(b, t))
    assert exported.out_avals[0].shape == (b, t, CFG.tgt_vocab_size)
    rng = np.random.default_rng(0)
    for batch, src_len, tgt_len in [(1, 5, 3), (3, 16, 9)]:
        src = tokens(rng, batch, src_len, CFG.src_vocab_size)
        tgt = tokens(rng, batch, tgt_len, CFG.tgt_vocab_size)
        got = np.asarray(exported.call(src, tgt))
        assert got.shape == (batch, tgt_len, CFG.tgt_vocab_size)
        np.testing.assert_allclose(got, forward(src, tgt), rtol=0, atol=1e-6)


def test_lm_forward_with_symbolic_batch_and_length():
    model = TransformerLM(CFG)
    variables = random_variables(model, seed=1)
    forward = jax.jit(lambda x: model.apply(variables, x))
    b, n = export.symbolic_shape("b, n", constraints=["n <= 16"])
    exported = export.export(forward)(jax.ShapeDtypeStruct((b, n), jnp.int32))
    rng = np.random.default_rng(1)
    for batch, length in [(2, 4), (5, 11)]:
        x = tokens(rng, batch, length, CFG.tgt_vocab_size)
        np.testing.assert_allclose(exported.call(x), forward(x), rtol=0, atol=1e-6)


def test_an_unbounded_symbolic_length_is_named(seq2seq):
    model, variables = seq2seq
    b, s = export.symbolic_shape("b, s")
    spec = jax.ShapeDtypeStruct((b, s), jnp.int32)
    with pytest.raises(ValueError, match=r"(src|tgt) has the symbolic length s.*'s <= 16'"):
        export.export(jax.jit(lambda x: model.apply(variables, x, x)))(spec)


def test_concrete_shapes_keep_their_checks(seq2seq):
    model, variables = seq2seq
    ok, long = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 17), jnp.int32)
    with pytest.raises(ValueError, match="src has length 17, longer than the model's max_len 16"):
        model.apply(variables, long, ok)
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 1, 1, 4\) does not broadcast"):
        model.apply(variables, ok, ok, src_mask=jnp.ones((2, 1, 1, 4), bool))
