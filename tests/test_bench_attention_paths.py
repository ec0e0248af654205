"""The fused attention path (jax.nn.dot_product_attention; attention_impl "auto" takes it on GPU
when no weights are requested) computes what the einsum path computes, fully masked rows
included; weights are still sown whenever "intermediates" is mutable. Forced on here with
attention_impl="fused", so CPU CI covers it."""

from __future__ import annotations

import functools

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


def test_attention_impl_picks_the_path():
    mask = jnp.ones((1, 1, 2, 2), bool)
    assert attention.use_fused_attention("fused", mask)
    assert not attention.use_fused_attention("reference", mask)
    assert attention.use_fused_attention("auto", None) == (jax.default_backend() == "gpu")
    # An additive float mask keeps the explicit path whatever the setting.
    assert not attention.use_fused_attention("fused", jnp.zeros((1, 1, 2, 2), jnp.float32))
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        attention.use_fused_attention("flash", mask)
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        CFG.replace(attention_impl="flash")
    # A config.json written before the field existed still loads, with the default.
    old = {name: value for name, value in CFG.to_dict().items() if name != "attention_impl"}
    assert TransformerConfig.from_dict(old).attention_impl == "auto"


@pytest.mark.slow  # ~8 s: a forward and gradients on both attention paths
def test_model_forward_and_gradients_equal_on_both_paths(monkeypatch):
    src = jnp.asarray([[5, 6, 7, 8, 0, 0], [0, 0, 0, 0, 0, 0]], jnp.int32)  # row 2 all padding
    tgt = jnp.asarray([[3, 4, 5, 0], [9, 10, 0, 0]], jnp.int32)
    params = jax.jit(Transformer(CFG).init)(jax.random.key(0), src, tgt)["params"]
    fused_calls = []
    fused = attention.fused_attention
    monkeypatch.setattr(
        attention, "fused_attention", lambda *args: fused_calls.append(1) or fused(*args)
    )

    @functools.partial(jax.jit, static_argnums=1)
    @jax.value_and_grad
    def loss(params, impl):
        model = Transformer(CFG.replace(attention_impl=impl))
        return jnp.sum(jnp.tanh(model.apply({"params": params}, src, tgt)) ** 2)

    results = {"reference": loss(params, "reference")}
    assert not fused_calls
    results["fused"] = loss(params, "fused")
    assert len(fused_calls) == 3  # encoder self, decoder self and cross attention
    assert_close(results["fused"][0], results["reference"][0], rtol=1e-6, what="loss")
    for g_fused, g_plain in zip(
        jax.tree.leaves(results["fused"][1]), jax.tree.leaves(results["reference"][1]), strict=True
    ):
        assert_close(g_fused, g_plain, atol=1e-5, what="gradient")


def test_weights_are_still_sown_when_requested():
    src = jnp.asarray([[5, 6, 7]], jnp.int32)
    tgt = jnp.asarray([[3, 4]], jnp.int32)
    model = Transformer(CFG.replace(attention_impl="fused"))
    variables = jax.jit(model.init)(jax.random.key(0), src, tgt)  # jitted: faster than eager
    apply = jax.jit(functools.partial(model.apply, mutable=["intermediates"]))
    _, state = apply(variables, src, tgt)
    sown = jax.tree.leaves(state["intermediates"])
    assert any(leaf.shape == (1, CFG.num_heads, 2, 3) for leaf in sown)  # cross-attention
