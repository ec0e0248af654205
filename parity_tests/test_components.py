"""Each component on its own: Flax with converted weights == the torch twin."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer.nn import attention, blocks, layers, model
from flax_transformer.spec.numerics import assert_close

from .helpers import convert_module, random_floats, small_config, to_numpy

F64 = dict(rtol=1e-12)


@pytest.fixture
def rng():
    torch.manual_seed(0)
    return np.random.default_rng(0)


def ragged_key_mask(batch, k_len, lengths):
    mask = np.zeros((batch, 1, 1, k_len), dtype=bool)
    for row, n in enumerate(lengths):
        mask[row, ..., :n] = True
    return mask


def test_scaled_dot_product_attention_with_weights(rng):
    q, tq = random_floats(rng, (2, 5, 3, 8), "float64")  # (batch, q_len, heads, head_dim)
    k, tk = random_floats(rng, (2, 7, 3, 8), "float64")
    v, tv = random_floats(rng, (2, 7, 3, 8), "float64")
    mask = ragged_key_mask(2, 7, [7, 4]) & np.tril(np.ones((5, 7), bool), 2)[None, None]
    out, weights = attention.scaled_dot_product_attention(q, k, v, jnp.asarray(mask))
    t_out, t_weights = tr.scaled_dot_product_attention(
        tq.transpose(1, 2), tk.transpose(1, 2), tv.transpose(1, 2), torch.from_numpy(mask)
    )
    assert_close(out, to_numpy(t_out.transpose(1, 2)), **F64, what="attention output")
    assert_close(weights, to_numpy(t_weights), **F64, what="attention weights")
    # Weights are a distribution over allowed keys and exactly zero on masked ones.
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.asarray(weights)[~np.broadcast_to(mask, weights.shape)] == 0.0)


def test_fully_masked_query_row_gives_zeros_not_nan(rng):
    q, tq = random_floats(rng, (1, 3, 2, 4), "float64")
    mask = np.ones((1, 1, 3, 3), dtype=bool)
    mask[..., 1, :] = False  # query 1 may attend to nothing
    out, weights = attention.scaled_dot_product_attention(q, q, q, jnp.asarray(mask))
    t_out, _ = tr.scaled_dot_product_attention(
        tq.transpose(1, 2), tq.transpose(1, 2), tq.transpose(1, 2), torch.from_numpy(mask)
    )
    assert np.all(np.isfinite(np.asarray(out)))
    assert np.all(np.asarray(out)[:, 1] == 0.0) and np.all(np.asarray(weights)[..., 1, :] == 0.0)
    assert_close(out, to_numpy(t_out.transpose(1, 2)), **F64, what="fully masked row")


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_multi_head_attention(rng, kind):
    cfg = small_config()
    x, tx = random_floats(rng, (2, 6, cfg.d_model), "float64")
    mem, tmem = random_floats(rng, (2, 9, cfg.d_model), "float64")
    if kind == "self":
        mask = ragged_key_mask(2, 6, [6, 3]) & np.tril(np.ones((6, 6), bool))[None, None]
        inputs, t_inputs = (x,), (tx,)
    else:
        mask = ragged_key_mask(2, 9, [9, 5])
        inputs, t_inputs = (x, mem), (tx, tmem)
    t_mha = tr.MultiHeadAttention(cfg).double()
    f_mha = attention.MultiHeadAttention(cfg)
    params = convert_module(t_mha, f_mha, *inputs)
    out = f_mha.apply(params, *inputs, mask=jnp.asarray(mask), is_cross=kind == "cross")
    ref = t_mha(*t_inputs, mask=torch.from_numpy(mask))
    assert_close(out, to_numpy(ref), **F64, what=f"{kind}-attention")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(rng, activation):
    cfg = small_config(activation=activation)
    x, tx = random_floats(rng, (2, 5, cfg.d_model), "float64")
    t_ffn = tr.FeedForward(cfg).double().eval()
    f_ffn = layers.FeedForward(cfg)
    params = convert_module(t_ffn, f_ffn, x)
    assert_close(f_ffn.apply(params, x), to_numpy(t_ffn(tx)), **F64, what=f"ffn {activation}")


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_positional_encoding(rng, positional):
    cfg = small_config(positional=positional)
    x, tx = random_floats(rng, (2, 7, cfg.d_model), "float64")
    t_pos = tr.PositionalEncoding(cfg).double()
    f_pos = layers.PositionalEncoding(cfg)
    params = convert_module(t_pos, f_pos, x) if positional == "learned" else {}
    for offset in (0, 5):
        out = f_pos.apply(params, x, offset)
        assert_close(out, to_numpy(t_pos(tx, offset)), **F64, what=f"{positional} @ {offset}")


def test_sinusoidal_table_is_the_papers_interleaved_formula():
    table = layers.sinusoidal_table(50, 16)
    pos, i = 17, 3
    angle = pos / 10000 ** (2 * i / 16)
    assert table[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-15)
    assert table[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-15)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block(rng, norm_first):
    cfg = small_config(norm_first=norm_first, activation="gelu")
    x, tx = random_floats(rng, (3, 6, cfg.d_model), "float64")
    mask = ragged_key_mask(3, 6, [6, 2, 4])
    t_block = tr.EncoderBlock(cfg).double().eval()
    f_block = blocks.EncoderBlock(cfg)
    params = convert_module(t_block, f_block, x)
    out = f_block.apply(params, x, jnp.asarray(mask))
    assert_close(out, to_numpy(t_block(tx, torch.from_numpy(mask))), **F64, what="encoder block")


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block(rng, norm_first):
    cfg = small_config(norm_first=norm_first)
    x, tx = random_floats(rng, (2, 5, cfg.d_model), "float64")
    mem, tmem = random_floats(rng, (2, 8, cfg.d_model), "float64")
    self_mask = ragged_key_mask(2, 5, [5, 3]) & np.tril(np.ones((5, 5), bool))[None, None]
    cross_mask = ragged_key_mask(2, 8, [4, 8])
    t_block = tr.DecoderBlock(cfg).double().eval()
    f_block = blocks.DecoderBlock(cfg)
    params = convert_module(t_block, f_block, x, mem)
    out = f_block.apply(params, x, mem, jnp.asarray(self_mask), jnp.asarray(cross_mask))
    ref = t_block(tx, tmem, torch.from_numpy(self_mask), torch.from_numpy(cross_mask))
    assert_close(out, to_numpy(ref), **F64, what="decoder block")


@pytest.mark.parametrize("final_norm", [False, True])
def test_encoder_and_decoder_stacks(rng, final_norm):
    cfg = small_config(final_norm=final_norm, num_encoder_layers=3)
    x, tx = random_floats(rng, (2, 6, cfg.d_model), "float64")
    mem_mask = ragged_key_mask(2, 6, [6, 4])
    t_enc, f_enc = tr.Encoder(cfg).double().eval(), model.Encoder(cfg)
    enc_params = convert_module(t_enc, f_enc, x)
    encoded = f_enc.apply(enc_params, x, jnp.asarray(mem_mask))
    t_encoded = t_enc(tx, torch.from_numpy(mem_mask))
    assert_close(encoded, to_numpy(t_encoded), **F64, what="encoder")

    y, ty = random_floats(rng, (2, 4, cfg.d_model), "float64")
    causal = np.tril(np.ones((4, 4), bool))[None, None]
    t_dec, f_dec = tr.Decoder(cfg).double().eval(), model.Decoder(cfg)
    dec_params = convert_module(t_dec, f_dec, y, encoded)
    out = f_dec.apply(dec_params, y, encoded, jnp.asarray(causal), jnp.asarray(mem_mask))
    ref = t_dec(ty, t_encoded, torch.from_numpy(causal), torch.from_numpy(mem_mask))
    assert_close(out, to_numpy(ref), **F64, what="decoder")
