"""flax_transformer.nnx: the NNX models compute what the linen models compute (float64 1e-12),
from converted weights, and three `nnx.Optimizer` steps equal three linen train steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flax_transformer import nnx as ftnnx
from flax_transformer.data.packing import pack_examples
from flax_transformer.data.pipeline import Dataset
from flax_transformer.interop.convert import (
    expected_param_shapes,
    flax_to_torch_state,
    torch_state_to_flax,
)
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.kinds import model_inputs
from flax_transformer.spec.naming import flatten_params, unflatten_params
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.presets import preset
from flax_transformer.spec.tree_check import ConversionError
from flax_transformer.training.optim import make_optimizer, make_schedule
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import loss_fn, make_train_step

KINDS = ["seq2seq", "lm"]
STEPS = 3


def config():
    return preset("tiny", dtype="float64", param_dtype="float64")


def make_batch(seed=0, batch=3, length=7):
    """Padding in both source and target, so the token weighting matters."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 40, (batch, length)).astype(np.int32)
    tgt = rng.integers(3, 44, (batch, length + 1)).astype(np.int32)
    src[1, 4:] = 0
    tgt[2, 3:] = 0
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


@functools.cache
def converted_weights(kind, seed=0):
    """A torch-layout state dict of random values (what torch would save; no torch needed),
    converted by the project's converter to the linen tree {"params": ...}. Call with x64 on."""
    rng = np.random.default_rng(seed)
    flax_shaped = {
        path: rng.normal(1.0 if path[-1] == "scale" else 0.0, 0.2, shape)
        for path, (shape, _) in expected_param_shapes(config(), kind).items()
    }
    torch_state = flax_to_torch_state(unflatten_params(flax_shaped))
    return torch_state_to_flax(torch_state, config(), kind)


def assert_trees_close(actual, expected, what):
    """Same paths, float64 leaves, each within 1e-12."""
    actual, expected = flatten_params(actual), flatten_params(expected)
    assert actual.keys() == expected.keys(), what
    for path, want in expected.items():
        assert np.asarray(actual[path]).dtype == np.float64, path
        assert_close(actual[path], want, atol=1e-12, what=f"{what} {'/'.join(path)}")


@pytest.mark.parametrize("kind", KINDS)
def test_nnx_model_from_converted_weights_gives_the_linen_logits(kind):
    with jax.enable_x64(True):
        weights = converted_weights(kind)
        model = ftnnx.model_for_nnx(
            config(), kind, rngs=nnx.Rngs(0), params=converted_weights(kind, 1)
        )
        assert isinstance(model, nnx.Module) and model.kind == kind
        inputs = tuple(jnp.asarray(a) for a in model_inputs(make_batch(), kind))
        forward = nnx.jit(lambda m, *x: m(*x))
        before = forward(model, *inputs)

        ftnnx.load_params(model, weights)
        logits = forward(model, *inputs)  # (batch, len, tgt_vocab)
        expected = jax.jit(model_for(config(), kind).apply)(weights, *inputs)
        assert logits.shape == expected.shape == (*inputs[-1].shape, config().tgt_vocab_size)
        assert_close(logits, expected, atol=1e-12, what=f"{kind} logits")
        assert float(jnp.max(jnp.abs(before - expected))) > 1e-3  # the load changed the model
        # The params come back out as the linen tree, unchanged.
        assert_trees_close(ftnnx.linen_params(model), weights["params"], "params")


# The seq2seq case (~10 s on 2 cores) is a long run (CI); the LM case stays in the fast suite.
@pytest.mark.parametrize("kind", [pytest.param("seq2seq", marks=pytest.mark.slow), "lm"])
def test_nnx_optimizer_steps_equal_linen_train_steps(kind):
    with jax.enable_x64(True):
        weights = converted_weights(kind)
        tx = make_optimizer(make_schedule("inverse_sqrt", 1e-2, 2, 10), weight_decay=0.01)
        batches = [make_batch(seed) for seed in range(STEPS)]

        model = ftnnx.model_for_nnx(config(), kind, rngs=nnx.Rngs(0), params=weights)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        nnx_step = ftnnx.make_train_step(label_smoothing=0.1)
        nnx_metrics = [nnx_step(model, optimizer, batch) for batch in batches]

        linen = model_for(config(), kind)
        state = create_train_state(linen, tx, seed=0, params=weights["params"])
        linen_step = jax.jit(make_train_step(linen, tx, label_smoothing=0.1))
        for step, batch in enumerate(batches):
            state, metrics = linen_step(state, batch)
            for name in ("loss_sum", "token_count", "correct", "grad_norm"):
                assert_close(
                    nnx_metrics[step][name], metrics[name], atol=1e-12, what=f"step {step} {name}"
                )
        assert int(optimizer.step[...]) == int(state.step) == STEPS
        assert_trees_close(ftnnx.linen_params(model), state.params, "params after 3 steps")
        # The steps did train: the weights moved well past the tolerance.
        start, end = flatten_params(weights), flatten_params(state.params)
        assert max(np.max(np.abs(np.asarray(end[k]) - start[k])) for k in start) > 1e-3


def packed_batch(kind):
    """Five examples packed two to a row (--pack): segment ids and per-example positions."""
    rng = np.random.default_rng(5)
    lengths = [3, 2, 4, 2, 3]
    tgt = [rng.integers(3, 44, n + 1).astype(np.int32) for n in lengths]
    src = [rng.integers(3, 40, n).astype(np.int32) for n in lengths]
    dataset = Dataset([t[:-1] for t in tgt], [t[1:] for t in tgt],
                      src if kind == "seq2seq" else None, [])  # fmt: skip
    return pack_examples(dataset, [[0, 1], [2, 3], [4]], rows=3, length=7)


@pytest.mark.parametrize("kind", KINDS)
def test_nnx_loss_keeps_packed_examples_apart_as_linen_does(kind):
    with jax.enable_x64(True):
        weights, batch = converted_weights(kind), packed_batch(kind)
        model = ftnnx.model_for_nnx(config(), kind, rngs=nnx.Rngs(0), params=weights)
        loss, aux = ftnnx.loss_fn(model, batch)
        linen = model_for(config(), kind)
        expected, expected_aux = loss_fn(weights["params"], batch, model=linen)
        assert_close(loss, expected, atol=1e-12, what=f"{kind} packed loss")
        assert_close(aux["correct"], expected_aux["correct"], atol=0, what="correct")
        # The same rows without their segment ids (examples seeing each other) differ.
        unpacked = {k: v for k, v in batch.items() if not k.endswith(("segments", "positions"))}
        assert abs(float(ftnnx.loss_fn(model, unpacked)[0]) - float(expected)) > 1e-6


def test_random_init_has_the_linen_tree_and_bad_weights_are_refused():
    with jax.enable_x64(True):
        model = ftnnx.Transformer(config(), rngs=nnx.Rngs(0))
        params = ftnnx.linen_params(model)
        expected = expected_param_shapes(config(), "seq2seq")
        found = {path: (leaf.shape, leaf.dtype) for path, leaf in flatten_params(params).items()}
        assert found == expected
        embedding = params["src_embed"]["embedding"]  # normal(d_model ** -0.5), not a constant
        assert 0.1 < float(jnp.std(embedding)) < 0.3

        # A decoder-only tree lacks the encoder: one ConversionError names what is missing.
        with pytest.raises(ConversionError, match="encoder"):
            ftnnx.load_params(model, converted_weights("lm"))
        with pytest.raises(ConversionError, match="encoder"):
            ftnnx.Transformer(config(), rngs=nnx.Rngs(0), params=converted_weights("lm"))
