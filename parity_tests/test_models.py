"""Whole models: Flax Transformer / TransformerLM with converted weights == the torch twin."""

import jax
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer import Transformer, TransformerConfig, TransformerLM
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.spec.numerics import assert_close

from .helpers import random_tokens, small_config, to_numpy

VARIANTS = {
    "paper": dict(),
    "pre_ln_final_norm": dict(norm_first=True, final_norm=True),
    "gelu_scaled": dict(activation="gelu", scale_embeddings=True, layer_norm_eps=1e-6),
    "shared_tied": dict(share_embeddings=True, tie_output=True, tgt_vocab_size=37),
    "learned_positions": dict(positional="learned", pad_id=3),
}


def seq2seq_logits(cfg, rng, src_lengths=(11, 6, 9), tgt_lengths=(8, 8, 3)):
    torch_model = tr.Transformer(cfg).eval()
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg)
    src = random_tokens(rng, 3, 11, cfg.src_vocab_size, src_lengths, cfg.pad_id)
    tgt = random_tokens(rng, 3, 8, cfg.tgt_vocab_size, tgt_lengths, cfg.pad_id)
    src[src == cfg.pad_id] = cfg.pad_id  # ids drawn in [1, vocab) may equal a nonzero pad_id
    flax_out = Transformer(cfg).apply(params, src, tgt)
    with torch.no_grad():
        torch_out = torch_model(torch.from_numpy(src), torch.from_numpy(tgt))
    valid = tgt != cfg.pad_id  # compare real target positions
    return np.asarray(flax_out)[valid], to_numpy(torch_out)[valid]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformer_float64(variant):
    torch.manual_seed(1)
    actual, expected = seq2seq_logits(small_config(**VARIANTS[variant]), np.random.default_rng(1))
    assert_close(actual, expected, rtol=1e-12, what=f"Transformer logits ({variant})")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformer_lm_float64(variant):
    torch.manual_seed(2)
    cfg = small_config(**VARIANTS[variant])
    rng = np.random.default_rng(2)
    torch_model = tr.TransformerLM(cfg).eval()
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg, "lm")
    tokens = random_tokens(rng, 3, 10, cfg.tgt_vocab_size, (10, 4, 7), cfg.pad_id)
    flax_out = np.asarray(TransformerLM(cfg).apply(params, tokens))
    with torch.no_grad():
        torch_out = to_numpy(torch_model(torch.from_numpy(tokens)))
    valid = tokens != cfg.pad_id
    assert_close(flax_out[valid], torch_out[valid], rtol=1e-12, what=f"LM logits ({variant})")


def test_transformer_float32_logits_within_1e_5():
    """The issue's float32 bar: a 2+2-layer d_model=128 model, matmul precision highest."""
    torch.manual_seed(3)
    cfg = TransformerConfig(
        src_vocab_size=300,
        tgt_vocab_size=310,
        d_model=128,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=512,
        max_len=64,
        dropout_rate=0.0,
    )
    with jax.enable_x64(False):  # plain float32 JAX, as users run it
        actual, expected = seq2seq_logits(cfg, np.random.default_rng(3))
    assert actual.dtype == np.float32
    assert_close(actual, expected, atol=1e-5, what="float32 logits")


def test_encode_and_decode_methods_compose_to_call():
    torch.manual_seed(4)
    cfg = small_config()
    rng = np.random.default_rng(4)
    model = Transformer(cfg)
    params = torch_state_to_flax(tr.state_dict_to_numpy(tr.Transformer(cfg)), cfg)
    src = random_tokens(rng, 2, 7, cfg.src_vocab_size, (7, 3))
    tgt = random_tokens(rng, 2, 5, cfg.tgt_vocab_size)
    src_mask = src[:, None, None, :] != cfg.pad_id
    encoded = model.apply(params, src, method=Transformer.encode)
    logits = model.apply(params, encoded, tgt, src_mask=src_mask, method=Transformer.decode)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(model.apply(params, src, tgt)))


def test_attention_weights_can_be_read_out():
    cfg = small_config()
    model = Transformer(cfg)
    src = random_tokens(np.random.default_rng(5), 2, 7, cfg.src_vocab_size, (7, 3))
    tgt = random_tokens(np.random.default_rng(6), 2, 5, cfg.tgt_vocab_size)
    params = model.init(jax.random.key(0), src, tgt)
    _, state = model.apply(params, src, tgt, mutable=["intermediates"])
    cross = state["intermediates"]["decoder"]["layers_1"]["cross_attn"]["attention_weights"][0]
    assert cross.shape == (2, cfg.num_heads, 5, 7)  # (batch, heads, tgt_len, src_len)
    np.testing.assert_allclose(np.asarray(cross).sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.asarray(cross)[1, :, :, 3:] == 0.0)  # padded source keys get no weight
