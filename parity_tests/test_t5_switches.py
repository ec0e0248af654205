"""The switches T5-style models need (RMS norm, relative position bias, gated FFN, unscaled
logits, heads narrower or wider than d_model / num_heads, decoder output scaling), each in both
twins in float64, against the formulas, and each one changing the function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer.nn import attention, layers
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.relative import relative_bucket_table, relative_buckets

from .helpers import convert_module, random_floats, small_config, to_numpy

F64 = dict(rtol=1e-12)


@pytest.fixture
def rng():
    torch.manual_seed(0)
    return np.random.default_rng(0)


def test_relative_buckets_are_transformers_buckets():
    """Every bucket, for settings of every kind (T5's 32 / 128, small ones, odd ones), equals
    transformers' T5Attention._relative_position_bucket, past max_distance included."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    for buckets in (4, 6, 8, 32, 128):
        for distance in sorted({buckets // 2 + 1, buckets, 20, 128, 257}):
            if distance <= buckets // 2:
                continue
            for bidirectional in (True, False):
                relative = torch.arange(-distance - 9, distance + 10)
                expected = t5.T5Attention._relative_position_bucket(
                    relative, bidirectional, buckets, distance
                ).numpy()
                got = relative_buckets(relative.numpy(), buckets, distance, bidirectional)
                np.testing.assert_array_equal(got, expected, err_msg=f"{buckets}, {distance}")


def test_relative_buckets_by_hand():
    """Bidirectional 8 buckets, max distance 8: 4 a side, distances 0..1 exact, then 2 + 2 *
    log2(d / 2) up to the last; keys after the query take the upper half. Causal: 8 buckets
    for the earlier keys, 0..3 exact, then 4 + 4 * log2(d / 4)."""
    table = relative_bucket_table(8, 8, True)
    by_distance = {r: int(table[r + 8]) for r in range(-8, 9)}
    assert [by_distance[-d] for d in range(9)] == [0, 1, 2, 2, 3, 3, 3, 3, 3]
    assert [by_distance[d] for d in range(1, 9)] == [5, 6, 6, 7, 7, 7, 7, 7]
    causal = relative_bucket_table(8, 8, False)
    assert list(causal[8:]) == [0] * 9  # a later key counts as distance 0
    assert list(causal[:9][::-1]) == [0, 1, 2, 3, 4, 5, 6, 7, 7]


def test_rms_norm_is_the_formula_in_both_twins(rng):
    cfg = small_config(norm_type="rms", layer_norm_eps=1e-6)
    x, tx = random_floats(rng, (2, 5, cfg.d_model), "float64")
    t_norm = tr.model.RMSNorm(cfg.d_model, 1e-6).double()
    with torch.no_grad():
        t_norm.weight.add_(torch.randn_like(t_norm.weight))
    f_norm = layers.layer_norm(cfg, "norm")
    params = convert_module(t_norm, f_norm, x)
    out = np.asarray(f_norm.apply(params, x))
    weight = np.asarray(params["params"]["scale"])
    xn = np.asarray(x)
    expected = xn / np.sqrt(np.mean(xn**2, -1, keepdims=True) + 1e-6) * weight
    assert_close(out, expected, rtol=1e-14, what="RMSNorm formula")
    assert_close(out, to_numpy(t_norm(tx)), **F64, what="RMSNorm twins")
    assert "bias" not in params["params"]  # no bias, even with use_bias


def test_rms_norm_statistics_run_in_float32_for_bfloat16(rng):
    """bfloat16 inputs: the mean square in float32, the normalised value rounded to bfloat16,
    then scaled in bfloat16 (T5LayerNorm's order)."""
    cfg = small_config("bfloat16", norm_type="rms")
    x = jnp.asarray(rng.standard_normal((3, cfg.d_model)) * 40, jnp.bfloat16)
    norm = layers.layer_norm(cfg, "norm")
    params = {"params": {"scale": jnp.full((cfg.d_model,), 1.5, jnp.bfloat16)}}
    out = norm.apply(params, x)
    assert out.dtype == jnp.bfloat16
    x32 = np.asarray(x, np.float32)
    normed = x32 / np.sqrt(np.mean(x32**2, -1, keepdims=True) + cfg.layer_norm_eps)
    expected = jnp.asarray(normed, jnp.bfloat16) * jnp.bfloat16(1.5)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))


def test_gated_feed_forward_in_both_twins(rng):
    cfg = small_config(gated_ffn=True, activation="gelu_tanh", use_bias=False)
    x, tx = random_floats(rng, (2, 5, cfg.d_model), "float64")
    t_ffn = tr.FeedForward(cfg).double().eval()
    f_ffn = layers.FeedForward(cfg)
    params = convert_module(t_ffn, f_ffn, x)
    out = np.asarray(f_ffn.apply(params, x))
    assert_close(out, to_numpy(t_ffn(tx)), **F64, what="gated ffn twins")
    p = params["params"]
    gelu = layers.activation_fn("gelu_tanh")
    hidden = np.asarray(gelu(x @ p["linear1"]["kernel"])) * np.asarray(x @ p["linear3"]["kernel"])
    assert_close(out, hidden @ np.asarray(p["linear2"]["kernel"]), rtol=1e-13, what="formula")
    assert set(p) == {"linear1", "linear2", "linear3"}
    assert all(set(v) == {"kernel"} for v in p.values())  # use_bias=False: no biases


@pytest.mark.parametrize("scale", [True, False])
def test_attention_scaling_switch_and_bias_in_both_twins(rng, scale):
    cfg = small_config(scale_attention_logits=scale, attention_head_dim=5, use_bias=False)
    x, tx = random_floats(rng, (2, 6, cfg.d_model), "float64")
    bias, tbias = random_floats(rng, (1, cfg.num_heads, 6, 6), "float64")
    mask = np.tril(np.ones((6, 6), bool))[None, None]
    t_attn = tr.MultiHeadAttention(cfg).double().eval()
    f_attn = attention.MultiHeadAttention(cfg)
    params = convert_module(t_attn, f_attn, x)
    assert params["params"]["query"]["kernel"].shape == (cfg.d_model, 15)  # 3 heads x 5
    out = np.asarray(f_attn.apply(params, x, mask=jnp.asarray(mask), bias=bias))
    expected = t_attn(tx, mask=torch.from_numpy(mask), bias=tbias)
    assert_close(out, to_numpy(expected), **F64, what=f"attention scale={scale}")
    other = cfg.replace(scale_attention_logits=not scale)
    flipped = attention.MultiHeadAttention(other).apply(params, x, mask=mask, bias=bias)
    assert np.max(np.abs(np.asarray(flipped) - out)) > 1e-6


def test_relative_bias_module_reads_the_table_in_both_twins(rng):
    cfg = small_config(relative_attention_buckets=8, relative_attention_max_distance=6)
    relative = np.arange(10)[None, None, :] - np.arange(10)[None, :, None]  # (1, 10, 10)
    for bidirectional in (True, False):
        t_bias = tr.model.RelativePositionBias(cfg, bidirectional).double()
        f_bias = layers.RelativePositionBias(cfg, bidirectional)
        params = convert_module(t_bias, f_bias, jnp.asarray(relative))
        out = np.asarray(f_bias.apply(params, jnp.asarray(relative)))
        assert out.shape == (1, cfg.num_heads, 10, 10)
        assert_close(out, to_numpy(t_bias(torch.from_numpy(relative))), rtol=0, atol=0)
        table = np.asarray(params["params"]["embedding"])
        buckets = relative_bucket_table(8, 6, bidirectional)
        far = buckets[-1]  # r = +7, past max_distance 6: the last entry's bucket
        assert_close(out[0, :, 2, 9], table[far], rtol=0, atol=0, what="r=+7")


def test_new_switches_default_off_and_bad_values_are_named():
    cfg = small_config()
    assert (cfg.norm_type, cfg.relative_attention_buckets, cfg.gated_ffn) == ("layer", 0, False)
    assert cfg.scale_attention_logits and not cfg.scale_decoder_output
    assert cfg.head_dim == cfg.attention_dim // cfg.num_heads == 8
    with pytest.raises(ValueError, match="relative_attention_buckets must be 0 or >= 4"):
        small_config(relative_attention_buckets=2)
    with pytest.raises(ValueError, match="relative_attention_max_distance"):
        small_config(relative_attention_buckets=16, relative_attention_max_distance=8)
    with pytest.raises(ValueError, match="norm_type"):
        small_config(norm_type="batch")
    assert small_config(d_model=25, num_heads=3, attention_head_dim=8).attention_dim == 24


def test_decoder_output_scaling_changes_only_the_scale(rng):
    """scale_decoder_output multiplies the last hidden state by d_model ** -0.5: with a tied
    head (no bias), the logits shrink by exactly that factor."""
    from flax_transformer import Transformer

    cfg = small_config(
        tie_output=True,
        share_embeddings=True,
        tgt_vocab_size=37,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    src = rng.integers(1, 37, (2, 7))
    tgt = rng.integers(1, 37, (2, 5))
    params = jax.jit(Transformer(cfg).init)(jax.random.key(0), src, tgt)
    plain = np.asarray(jax.jit(Transformer(cfg).apply)(params, src, tgt))
    scaled = jax.jit(Transformer(cfg.replace(scale_decoder_output=True)).apply)(params, src, tgt)
    assert_close(np.asarray(scaled), plain * cfg.d_model**-0.5, rtol=1e-13, what="scaled")


@pytest.mark.parametrize("per_layer", [False, True])
def test_bare_encoder_in_both_twins(rng, per_layer):
    """The "encoder" kind: the last hidden states (batch, len, d_model), padded rows
    included, with the T5 switches; its params are the seq2seq model's source side."""
    from flax_transformer import TransformerEncoder
    from flax_transformer.interop.convert import torch_state_to_flax
    from flax_transformer.spec.kinds import infer_model_kind

    from .helpers import random_tokens

    cfg = small_config(
        positional="none",
        relative_attention_buckets=8,
        relative_attention_max_distance=7,
        relative_attention_per_layer=per_layer,
        norm_type="rms",
        norm_first=True,
        final_norm=True,
        use_bias=False,
        scale_attention_logits=False,
        gated_ffn=True,
        activation="gelu_tanh",
        share_embeddings=True,
        tgt_vocab_size=37,
    )
    torch_model = tr.TransformerEncoder(cfg).eval()
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param))
    state = tr.state_dict_to_numpy(torch_model)
    assert infer_model_kind(state) == "encoder"
    assert not any(k.startswith(("decoder", "lm_head", "tgt")) for k in state)
    params = torch_state_to_flax(state, cfg, "encoder")
    src = random_tokens(rng, 3, 12, cfg.src_vocab_size, (12, 5, 9), cfg.pad_id)
    out = np.asarray(TransformerEncoder(cfg).apply(params, src))
    assert out.shape == (3, 12, cfg.d_model)
    with torch.no_grad():
        expected = to_numpy(torch_model(torch.from_numpy(src)))
    assert_close(out, expected, **F64, what=f"encoder hidden states (per_layer={per_layer})")
