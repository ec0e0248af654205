"""The architecture switches other codebases need (Hugging Face Marian / BART / GPT-2): each one
in both twins computes the same function in float64, and each one changes the function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer import Transformer, TransformerLM
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.nn import layers
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.sinusoid import sinusoidal_table

from .helpers import convert_module, random_floats, random_tokens, small_config, to_numpy

F64 = dict(rtol=1e-12)
ONE_LAYER = dict(num_encoder_layers=1, num_decoder_layers=1)  # whole models: kept cheap

# One model per family, as hf.load configures it (docs/hf.md), plus the single switches.
SEQ2SEQ_VARIANTS = {
    "marian": dict(
        sinusoid_layout="halves",
        activation="silu",
        scale_embeddings=True,
        share_embeddings=True,
        tie_output=True,
        tgt_vocab_size=37,
        final_logits_bias=True,
        mask_target_padding=False,
        pad_id=5,
        decoder_start_id=5,
        eos_id=2,
    ),
    "bart": dict(
        positional="learned",
        position_offset=2,
        separate_positions=True,
        embed_norm=True,
        activation="gelu",
        share_embeddings=True,
        tie_output=True,
        tgt_vocab_size=37,
        final_logits_bias=True,
        mask_target_padding=False,
        pad_id=1,
        bos_id=0,
        eos_id=2,
        decoder_start_id=2,
    ),
    "mbart": dict(
        positional="learned",
        position_offset=2,
        separate_positions=True,
        embed_norm=True,
        norm_first=True,
        final_norm=True,
        scale_embeddings=True,
        share_embeddings=True,
        tie_output=True,
        tgt_vocab_size=37,
        final_logits_bias=True,
        mask_target_padding=False,
    ),
    # T5 v1.0 as hf.load configures it: a relative bias shared by each stack's layers (log
    # buckets from distance 4 on, reached by the 11-token sources), RMS norm, no biases, no
    # logit scaling, no positions, the decoder output scaled before the tied head.
    "t5": dict(
        positional="none",
        relative_attention_buckets=8,
        relative_attention_max_distance=9,
        norm_type="rms",
        norm_first=True,
        final_norm=True,
        use_bias=False,
        scale_attention_logits=False,
        share_embeddings=True,
        tie_output=True,
        scale_decoder_output=True,
        tgt_vocab_size=37,
        mask_target_padding=False,
        layer_norm_eps=1e-6,
    ),
    # UMT5 / T5 v1.1: one bias per layer, gated gelu_new, an untied head; heads of width 10
    # (30 != d_model 24, as flan-t5-small's 6 x 64 != 512).
    "umt5": dict(
        positional="none",
        relative_attention_buckets=6,
        relative_attention_max_distance=7,
        relative_attention_per_layer=True,
        norm_type="rms",
        norm_first=True,
        final_norm=True,
        use_bias=False,
        scale_attention_logits=False,
        gated_ffn=True,
        activation="gelu_tanh",
        attention_head_dim=10,
        share_embeddings=True,
        tgt_vocab_size=37,
        lm_head_bias=False,
        mask_target_padding=False,
    ),
    "untied_head_without_bias": dict(lm_head_bias=False, final_logits_bias=True),
    "sinusoid_halves_with_offset": dict(sinusoid_layout="halves", position_offset=3),
}
LM_VARIANTS = {
    "gpt2": dict(
        positional="learned",
        norm_first=True,
        final_norm=True,
        activation="gelu_tanh",
        tie_output=True,
        mask_target_padding=False,
    ),
    "embed_norm_silu": dict(embed_norm=True, activation="silu", lm_head_bias=False),
    # Llama-like switches with a causal relative bias (per-token positions: left padding).
    "rms_gated_relative": dict(
        positional="none",
        relative_attention_buckets=8,
        relative_attention_max_distance=5,
        norm_type="rms",
        norm_first=True,
        final_norm=True,
        embed_norm=True,
        use_bias=False,
        gated_ffn=True,
        activation="silu",
        lm_head_bias=False,
        scale_decoder_output=True,
    ),
}


@pytest.fixture
def rng():
    torch.manual_seed(0)
    return np.random.default_rng(0)


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_feed_forward_activations(rng, activation):
    cfg = small_config(activation=activation)
    x, tx = random_floats(rng, (2, 5, cfg.d_model), "float64")
    t_ffn = tr.FeedForward(cfg).double().eval()
    f_ffn = layers.FeedForward(cfg)
    params = convert_module(t_ffn, f_ffn, x)
    out = f_ffn.apply(params, x)
    assert_close(out, to_numpy(t_ffn(tx)), **F64, what=f"ffn {activation}")
    exact = layers.FeedForward(small_config(activation="gelu")).apply(params, x)
    assert np.max(np.abs(np.asarray(out) - np.asarray(exact))) > 1e-6  # not the exact GELU


def test_activation_dropout_rate_is_the_ffn_dropout(rng):
    """activation_dropout_rate replaces dropout_rate after the activation (transformers'
    activation_dropout): 0 there makes the feed-forward deterministic in training too."""
    x, tx = random_floats(rng, (2, 5, 24), "float64")
    for rate, changes in ((0.0, dict(dropout_rate=0.5)), (0.5, dict(dropout_rate=0.0))):
        cfg = small_config(activation_dropout_rate=rate, **changes)
        ffn = layers.FeedForward(cfg)
        params = ffn.init(jax.random.key(0), x)
        train = ffn.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
        assert (np.max(np.abs(np.asarray(train - ffn.apply(params, x)))) > 0) == (rate > 0)
        t_ffn = tr.FeedForward(cfg).double().train()
        assert (not torch.equal(t_ffn(tx), t_ffn.eval()(tx))) == (rate > 0)


def test_gelu_tanh_is_gpt2s_formula_and_silu_is_swish():
    x = np.linspace(-5, 5, 101)
    new_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert_close(layers.activation_fn("gelu_tanh")(jnp.asarray(x)), new_gelu, rtol=1e-14)
    assert_close(layers.activation_fn("silu")(jnp.asarray(x)), x / (1 + np.exp(-x)), rtol=1e-14)


@pytest.mark.parametrize(
    "changes",
    [
        dict(sinusoid_layout="halves"),
        dict(sinusoid_layout="halves", position_offset=2),
        dict(positional="learned", position_offset=2),
    ],
    ids=["halves", "halves_offset", "learned_offset"],
)
def test_positional_encoding_switches(rng, changes):
    cfg = small_config(**changes)
    x, tx = random_floats(rng, (2, 7, cfg.d_model), "float64")
    t_pos = tr.PositionalEncoding(cfg).double()
    f_pos = layers.PositionalEncoding(cfg)
    params = convert_module(t_pos, f_pos, x) if cfg.positional == "learned" else {}
    for offset in (0, 5):
        out = f_pos.apply(params, x, offset)
        assert_close(out, to_numpy(t_pos(tx, offset)), **F64, what=f"{changes} @ {offset}")
    positions = np.array([[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]])  # a left-padded row
    out = f_pos.apply(params, x, 0, jnp.asarray(positions))
    expected = t_pos(tx, 0, torch.from_numpy(positions))
    assert_close(out, to_numpy(expected), **F64, what=f"{changes} per-token positions")
    assert_close(out[1], f_pos.apply(params, x, 0)[1], **F64, what="0.. rows = offset 0")
    table = sinusoidal_table(cfg.max_len + cfg.position_offset, cfg.d_model, cfg.sinusoid_layout)
    if cfg.positional == "learned":
        table = np.asarray(params["params"]["weight"])
    assert_close(out[0, 3] - x[0, 3], table[1 + cfg.position_offset], rtol=1e-15, what="row")


def test_sinusoid_halves_is_marians_table():
    """transformers' MarianSinusoidalPositionalEmbedding.create_weight, written out: sines of
    the even columns' angles first, then cosines of the odd ones, stored as float32."""
    n_pos, dim = 40, 10
    angle = np.array(
        [[p / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for p in range(n_pos)]
    )
    expected = np.concatenate(
        [np.sin(angle[:, 0::2]).astype(np.float32), np.cos(angle[:, 1::2]).astype(np.float32)], 1
    )
    table = sinusoidal_table(n_pos, dim, "halves")
    assert table.dtype == np.float64
    np.testing.assert_array_equal(table, expected.astype(np.float64))
    interleaved = sinusoidal_table(n_pos, dim)
    np.testing.assert_allclose(table[:, : dim // 2], interleaved[:, 0::2], atol=1e-7)
    np.testing.assert_allclose(table[:, dim // 2 :], interleaved[:, 1::2], atol=1e-7)


def seq2seq_pair(cfg, rng):
    torch_model = tr.Transformer(cfg).eval()
    with torch.no_grad():  # nonzero so a missing or misplaced bias would show
        for name, param in torch_model.named_parameters():
            if name.startswith("logits_bias") or "embed_norm" in name:
                param.add_(torch.randn_like(param))
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg)
    return torch_model, params


@pytest.mark.parametrize("variant", list(SEQ2SEQ_VARIANTS))
def test_transformer_switches_float64(rng, variant):
    cfg = small_config(**ONE_LAYER, **SEQ2SEQ_VARIANTS[variant])
    torch_model, params = seq2seq_pair(cfg, rng)
    src = random_tokens(rng, 3, 11, cfg.src_vocab_size, (11, 6, 9), cfg.pad_id)
    tgt = random_tokens(rng, 3, 8, cfg.tgt_vocab_size)
    tgt[:, 0] = cfg.decoder_start_id if cfg.decoder_start_id is not None else 1
    flax_out = np.asarray(Transformer(cfg).apply(params, src, tgt))
    with torch.no_grad():
        torch_out = to_numpy(torch_model(torch.from_numpy(src), torch.from_numpy(tgt)))
    assert_close(flax_out, torch_out, **F64, what=f"Transformer logits ({variant})")


@pytest.mark.parametrize("variant", list(LM_VARIANTS))
def test_lm_switches_float64(rng, variant):
    cfg = small_config(**ONE_LAYER, **LM_VARIANTS[variant])
    torch_model = tr.TransformerLM(cfg).eval()
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg, "lm")
    tokens = random_tokens(rng, 3, 10, cfg.tgt_vocab_size)
    positions = np.maximum(np.arange(10)[None] - np.array([[0], [3], [6]]), 0)  # left padding
    for pos in (None, positions):
        flax_out = np.asarray(
            TransformerLM(cfg).apply(params, tokens, positions=None if pos is None else pos)
        )
        with torch.no_grad():
            torch_pos = None if pos is None else torch.from_numpy(pos)
            torch_out = to_numpy(torch_model(torch.from_numpy(tokens), positions=torch_pos))
        assert_close(flax_out, torch_out, **F64, what=f"LM logits ({variant}, {pos is None})")


# A long cell (the fast suite is at its 8-minute budget): the slow pass (`pytest -m slow`, CI).
@pytest.mark.slow
def test_decoder_start_equal_to_pad_is_seen_only_without_target_padding_mask(rng):
    """Marian starts decoding with its pad id. The paper default hides pad keys (so the first
    query sees nothing); mask_target_padding=False is causal only, as transformers is."""
    cfg = small_config(**ONE_LAYER, **SEQ2SEQ_VARIANTS["marian"])
    torch_model, params = seq2seq_pair(cfg, rng)
    src = random_tokens(rng, 2, 6, cfg.src_vocab_size)
    tgt = random_tokens(rng, 2, 5, cfg.tgt_vocab_size)
    tgt[:, 0] = cfg.pad_id
    causal_only = np.asarray(Transformer(cfg).apply(params, src, tgt))
    hiding = np.asarray(Transformer(cfg.replace(mask_target_padding=True)).apply(params, src, tgt))
    assert np.max(np.abs(hiding - causal_only)) > 1e-3  # the pad key changes every row
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))[None, None]
    with torch.no_grad():  # the default is exactly an explicit causal mask
        torch_out = torch_model(torch.from_numpy(src), torch.from_numpy(tgt), tgt_mask=causal)
    assert_close(causal_only, to_numpy(torch_out), **F64, what="causal-only decoder")
