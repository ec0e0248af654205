"""config.remat=True (blocks wrapped in nn.remat) changes memory, never the numbers.

Gradients with and without remat are compared for both models: float64 to 1e-12 (the same
math), and float32 to 1e-6 with dropout on, which also proves that the recomputed forward draws
the same dropout masks as the first one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import preset
from flax_transformer.nn.kinds import abstract_variables
from flax_transformer.nn.model import Transformer, TransformerLM
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.numerics import assert_close

CONFIG = preset("tiny", num_decoder_layers=2)


def tokens(seed: int, shape, vocab: int):
    array = np.random.default_rng(seed).integers(3, vocab, shape).astype(np.int32)
    array[0, -2:] = 0  # padding in one row
    return jnp.asarray(array)


def loss_and_grads(
    kind: str, cfg: TransformerConfig, deterministic: bool = True, grads: bool = True
):
    """Loss and gradients (or the loss alone) of a sum-of-squares of the logits, params from a
    shared init."""
    src, tgt = tokens(0, (3, 7), cfg.src_vocab_size), tokens(1, (3, 6), cfg.tgt_vocab_size)
    base = cfg.replace(remat=False)
    if kind == "seq2seq":
        model, args = Transformer(cfg), (src, tgt)
        params = Transformer(base).init(jax.random.key(0), src, tgt)["params"]
    else:
        model, args = TransformerLM(cfg), (tgt,)
        params = TransformerLM(base).init(jax.random.key(0), tgt)["params"]
    params = jax.tree.map(lambda p: p.astype(cfg.param_dtype), params)

    def loss(params):
        logits = model.apply(
            {"params": params},
            *args,
            deterministic=deterministic,
            rngs={"dropout": jax.random.key(7)},
        )
        return jnp.sum(jnp.tanh(logits) ** 2)

    return jax.jit(jax.value_and_grad(loss) if grads else loss)(params)


def assert_same(with_remat, without_remat, rtol: float):
    (loss_r, grads_r), (loss_n, grads_n) = with_remat, without_remat
    assert_close(loss_r, loss_n, rtol=rtol, what="loss")
    paths_r = jax.tree_util.tree_flatten_with_path(grads_r)[0]
    flat_n = jax.tree.leaves(grads_n)
    assert len(paths_r) == len(flat_n)
    # Errors relative to the largest gradient: some gradients are zero in exact arithmetic
    # (key biases: softmax is shift-invariant), so their own scale is rounding noise.
    scale = max(float(jnp.max(jnp.abs(g))) for g in flat_n)
    for (path, g_r), g_n in zip(paths_r, flat_n, strict=True):
        what = f"grad {jax.tree_util.keystr(path)}"
        assert_close(g_r, g_n, atol=rtol * scale, what=what)


# The seq2seq case takes ~45 s on 2 cores: a long run (`pytest -m slow`, CI).
# Both kinds in the slow pass (the fast suite keeps remat's dropout masks and param tree).
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_remat_gradients_equal_float64(kind):
    cfg = CONFIG.replace(dtype="float64", param_dtype="float64")
    with jax.enable_x64(True):
        assert_same(
            loss_and_grads(kind, cfg.replace(remat=True)), loss_and_grads(kind, cfg), rtol=1e-12
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_remat_with_dropout_draws_the_same_masks(kind):
    # One block per stack: the unrolled dropout hash makes these programs slow to compile.
    cfg = CONFIG.replace(num_decoder_layers=1, dropout_rate=0.3, attention_dropout_rate=0.2)
    with_remat = loss_and_grads(kind, cfg.replace(remat=True), deterministic=False)
    without = loss_and_grads(kind, cfg, deterministic=False)
    assert_same(with_remat, without, rtol=1e-6)
    # ... and dropout is really on: the loss differs from the deterministic one.
    deterministic_loss = loss_and_grads(kind, cfg, grads=False)
    assert abs(float(without[0]) - float(deterministic_loss)) > 1e-3


def test_remat_keeps_the_param_tree():
    plain = abstract_variables(Transformer(CONFIG))["params"]
    remat = abstract_variables(Transformer(CONFIG.replace(remat=True)))["params"]
    shapes = lambda tree: jax.tree.map(lambda p: p.shape, tree)  # noqa: E731
    assert shapes(plain) == shapes(remat)
