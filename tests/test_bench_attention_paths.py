"""The fused attention path (jax.nn.dot_product_attention, used on GPU when no weights are
requested) computes what the einsum path computes, fully masked rows included; weights are
still sown whenever "intermediates" is mutable. Forced on here, so CPU CI covers it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.nn import attention
from flax_transformer.nn.model import Transformer
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.numerics import assert_close

CFG = TransformerConfig(
    src_vocab_size=31,
    tgt_vocab_size=37,
    d_model=16,
    num_heads=4,
    num_encoder_layers=1,
    num_decoder_layers=1,
    d_ff=24,
    dropout_rate=0.0,
    max_len=16,
)


@pytest.fixture
def force_fused(monkeypatch):
    def set_mode(mode):
        monkeypatch.setattr(attention, "FUSED_ATTENTION", mode)

    return set_mode


def test_fused_attention_matches_einsum_path_with_fully_masked_rows():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 5, 3, 4)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(rng.random((2, 1, 5, 5)) > 0.4)
    mask = mask.at[0, 0, 2].set(False)  # a query row that sees nothing
    expected, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    fused = attention.fused_attention(q, k, v, mask)
    assert_close(fused, expected, atol=1e-6, what="fused attention")
    assert float(jnp.max(jnp.abs(fused[0, 2]))) == 0.0
    assert_close(
        attention.fused_attention(q, k, v),
        attention.scaled_dot_product_attention(q, k, v)[0],
        atol=1e-6,
        what="unmasked",
    )


def test_model_forward_and_gradients_equal_on_both_paths(force_fused):
    src = jnp.asarray([[5, 6, 7, 8, 0, 0], [0, 0, 0, 0, 0, 0]], jnp.int32)  # row 2 all padding
    tgt = jnp.asarray([[3, 4, 5, 0], [9, 10, 0, 0]], jnp.int32)
    params = Transformer(CFG).init(jax.random.key(0), src, tgt)["params"]

    def loss(params):
        return jnp.sum(jnp.tanh(Transformer(CFG).apply({"params": params}, src, tgt)) ** 2)

    results = {}
    for mode in ("never", "always"):
        force_fused(mode)
        results[mode] = jax.value_and_grad(loss)(params)  # not jitted: re-traced per mode
    assert_close(results["always"][0], results["never"][0], rtol=1e-6, what="loss")
    for g_fused, g_plain in zip(
        jax.tree.leaves(results["always"][1]), jax.tree.leaves(results["never"][1]), strict=True
    ):
        assert_close(g_fused, g_plain, atol=1e-5, what="gradient")


def test_weights_are_still_sown_when_requested(force_fused):
    force_fused("always")
    src = jnp.asarray([[5, 6, 7]], jnp.int32)
    tgt = jnp.asarray([[3, 4]], jnp.int32)
    variables = Transformer(CFG).init(jax.random.key(0), src, tgt)
    _, state = Transformer(CFG).apply(variables, src, tgt, mutable=["intermediates"])
    sown = jax.tree.leaves(state["intermediates"])
    assert any(leaf.shape == (1, CFG.num_heads, 2, 3) for leaf in sown)  # cross-attention
