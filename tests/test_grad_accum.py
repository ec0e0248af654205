"""Gradient accumulation: N micro-batches of B/N make the optimizer step one batch of B makes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.presets import preset
from flax_transformer.training.optim import make_optimizer, make_schedule
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import make_train_step, split_micro_batches

BATCH, LENGTH = 8, 10
LR, STEPS = 1e-2, 3


def padded_batches(count, seed=0):
    """Batches whose rows hold 1..LENGTH real tokens: the micro-batches' token counts differ a
    lot, so a mean of per-micro-batch means would not be the batch's token-weighted mean."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        src = rng.integers(3, 40, (BATCH, LENGTH)).astype(np.int32)
        tgt = rng.integers(3, 44, (BATCH, LENGTH + 1)).astype(np.int32)
        for row, real in enumerate(rng.permutation([1, 1, 2, 2, 3, 9, 10, 10])):
            src[row, real:] = 0
            tgt[row, real + 1 :] = 0
        batches.append({"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]})
    return batches


def train(dtype, grad_accum):
    config = preset("tiny", dtype=dtype, param_dtype=dtype, dropout_rate=0.0)
    model = model_for(config, "seq2seq")
    # Clipping on, so that a wrong gradient scale would show in the update.
    opt = make_optimizer(make_schedule("inverse_sqrt", LR, 2, 10), clip_norm=0.5)
    state = create_train_state(model, opt, seed=0)
    step = jax.jit(make_train_step(model, opt, label_smoothing=0.1, grad_accum=grad_accum))
    sums = []
    for batch in padded_batches(STEPS):
        state, metrics = step(state, batch)
        sums.append([float(metrics[k]) for k in ("loss_sum", "token_count", "grad_norm")])
    return jax.device_get(state.params), np.array(sums)


# float32 is the slower of the two (42 s on 2 cores): a long run (`pytest -m slow`, CI).
@pytest.mark.parametrize(
    "dtype, tolerance",
    [("float64", 1e-12), pytest.param("float32", 1e-5, marks=pytest.mark.slow)],
    ids=["float64", "float32"],
)
def test_micro_batches_give_the_parameters_of_the_whole_batch(dtype, tolerance):
    context = jax.enable_x64(True) if dtype == "float64" else jax.enable_x64(False)
    with context:
        whole, whole_sums = train(dtype, 1)
        accumulated, sums = train(dtype, 4)
    np.testing.assert_allclose(sums, whole_sums, rtol=tolerance)
    flat_whole = jax.tree_util.tree_leaves_with_path(whole)
    for (path, expected), actual in zip(flat_whole, jax.tree.leaves(accumulated), strict=True):
        assert actual.dtype == np.dtype(dtype)
        name = "/".join(key.key for key in path)
        if name.endswith("key/bias"):
            # Softmax ignores a shift shared by a row of scores: these gradients are 0 in exact
            # arithmetic and both runs hold rounding noise, which Adam scales up (up to ~lr per
            # step): bound them instead.
            assert np.abs(actual - expected).max() <= 2 * LR * STEPS, name
            continue
        np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, err_msg=name)


def test_micro_batches_are_strided_rows_and_must_divide_the_batch():
    x = jnp.arange(12).reshape(6, 2)
    micro = split_micro_batches(x, 3)  # (3, 2, 2)
    np.testing.assert_array_equal(micro[1], x[1::3])
    with pytest.raises(ValueError, match="6 rows does not split into 4 micro-batches"):
        split_micro_batches(x, 4)
    with pytest.raises(ValueError, match="grad_accum must be >= 1"):
        make_train_step(None, None, grad_accum=0)
