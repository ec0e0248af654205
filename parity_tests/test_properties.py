"""Property-based parity over random shapes, head counts, layer counts, options and masks."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_reference as tr
from flax_transformer import Transformer, TransformerLM
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.spec.numerics import assert_close

from .helpers import small_config, to_numpy

PROPERTY_SETTINGS = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def configs(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    return small_config(
        d_model=heads * draw(st.sampled_from([2, 4, 6])),
        num_heads=heads,
        d_ff=draw(st.integers(3, 20)),
        num_encoder_layers=draw(st.integers(0, 2)),
        num_decoder_layers=draw(st.integers(1, 2)),
        norm_first=draw(st.booleans()),
        final_norm=draw(st.booleans()),
        activation=draw(st.sampled_from(["relu", "gelu"])),
        scale_embeddings=draw(st.booleans()),
        positional=draw(st.sampled_from(["sinusoidal", "learned"])),
    )


@st.composite
def token_batches(draw, vocab, batch, max_len=10):
    """(batch, length) ids with a random padding length per row (pad_id 0)."""
    length = draw(st.integers(1, max_len))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, size=(batch, length))
    for row in range(batch):
        tokens[row, draw(st.integers(1, length)) :] = 0
    return tokens


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(data=st.data(), cfg=configs())
def test_transformer_parity_property(data, cfg):
    batch = data.draw(st.integers(1, 3))
    src = data.draw(token_batches(cfg.src_vocab_size, batch))
    tgt = data.draw(token_batches(cfg.tgt_vocab_size, batch))
    torch.manual_seed(data.draw(st.integers(0, 1000)))
    torch_model = tr.Transformer(cfg).eval()
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg)
    flax_out = np.asarray(Transformer(cfg).apply(params, src, tgt))
    with torch.no_grad():
        torch_out = to_numpy(torch_model(torch.from_numpy(src), torch.from_numpy(tgt)))
    valid = tgt != 0
    assert_close(flax_out[valid], torch_out[valid], rtol=1e-12, what=f"logits for {cfg}")


@pytest.mark.slow  # a property search (~15 s on 2 cores): CI runs it
@PROPERTY_SETTINGS
@given(data=st.data(), cfg=configs())
def test_lm_parity_with_random_boolean_masks(data, cfg):
    """Arbitrary boolean masks (rows may be fully masked: those give zeros, not NaN)."""
    tokens = data.draw(token_batches(cfg.tgt_vocab_size, data.draw(st.integers(1, 3))))
    batch, length = tokens.shape
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    mask = rng.random((batch, 1, length, length)) < data.draw(st.floats(0.2, 1.0))
    torch.manual_seed(0)
    torch_model = tr.TransformerLM(cfg).eval()
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg, "lm")
    flax_out = np.asarray(TransformerLM(cfg).apply(params, tokens, mask=mask))
    with torch.no_grad():
        torch_out = to_numpy(torch_model(torch.from_numpy(tokens), torch.from_numpy(mask)))
    assert np.all(np.isfinite(flax_out))
    assert_close(flax_out, torch_out, rtol=1e-12, what=f"LM logits, random masks, {cfg}")
