"""The switches Llama-lineage decoders need (rotary positions and their scaling rules,
grouped-query and multi-query attention, q/k/v biases without an out bias, per-head q/k RMS
norms, sliding windows per layer, an explicit head_dim, tied and untied heads), each in both
twins in float64 on a left-padded ragged batch, each one changing the function, the rotary
frequencies against transformers' own, and cached decoding against the full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer import TransformerConfig
from flax_transformer.decoding.cache import init_cache
from flax_transformer.nn.model import TransformerLM
from flax_transformer.spec import rotary
from flax_transformer.spec.numerics import assert_close

from .helpers import convert_module

F64 = dict(rtol=1e-12)
VOCAB = 41
# A Llama-shaped decoder: pre-norm RMS, SwiGLU, no biases, rotary positions, untied head.
BASE = dict(
    src_vocab_size=VOCAB,
    tgt_vocab_size=VOCAB,
    d_model=24,
    num_heads=4,
    num_encoder_layers=0,
    num_decoder_layers=3,
    d_ff=40,
    max_len=64,
    dropout_rate=0.0,
    dtype="float64",
    param_dtype="float64",
    positional="rotary",
    norm_type="rms",
    layer_norm_eps=1e-6,
    norm_first=True,
    final_norm=True,
    use_bias=False,
    gated_ffn=True,
    activation="silu",
    lm_head_bias=False,
    mask_target_padding=False,
)
YARN = dict(rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=8)
# name: the switches on top of BASE
CELLS = {
    "rotary_default": {},
    "rope_theta": dict(rope_theta=500.0),
    "rope_linear": dict(rope_scaling="linear", rope_factor=2.5),
    "rope_dynamic": dict(rope_scaling="dynamic", rope_factor=3.0, rope_original_max_len=6),
    "rope_llama3": dict(
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_max_len=16,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_theta=500.0,
    ),
    "rope_yarn": YARN,
    "rope_yarn_mscale": dict(YARN, rope_mscale=1.0, rope_mscale_all_dim=0.5),
    "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1),
    "qkv_bias": dict(qkv_bias=True, num_kv_heads=2),
    "qk_norm_head_dim": dict(qk_norm=True, attention_head_dim=10, num_kv_heads=2),
    "sliding_window": dict(sliding_window=3),
    "sliding_window_from_layer": dict(sliding_window=3, sliding_window_from_layer=1),
    "tied_head": dict(tie_output=True),
    # Gemma's (1, 2, 3)
    "norm_weight_offset": dict(norm_weight_offset=True, qk_norm=True, attention_head_dim=10),
    "attention_logit_softcap": dict(attention_logit_softcap=0.2),
    "final_logit_softcap": dict(final_logit_softcap=0.05),
    "attention_scale_dim": dict(attention_scale_dim=2.0),
    "sliding_window_pattern": dict(sliding_window=3, sliding_window_pattern="sf"),
    "rope_local_theta": dict(
        sliding_window=3, sliding_window_pattern="fs", rope_local_theta=50.0, **YARN
    ),
    "sublayer_output_norm": dict(sublayer_output_norm=True),
    # Phi-3's: half of each head turned (4 of 8 dims), longrope past 8 tokens
    "rotary_fraction": dict(rotary_fraction=0.5, attention_head_dim=8, rope_theta=50.0),
    "rope_longrope": dict(
        rope_scaling="longrope",
        rope_original_max_len=8,
        rope_factor=4.0,
        rope_short_factors=(1.0, 1.5, 3.0),
        rope_long_factors=(2.0, 5.0, 11.0),
    ),
}


def config(**changes) -> TransformerConfig:
    return TransformerConfig(**{**BASE, **changes})


def left_padded(rng, lengths=(11, 6, 9)):
    """(tokens, key mask (B, 1, 1, L), positions (B, L)) of a left-padded batch: pads are
    token 0 at position 0, real tokens count from 0 (transformers' position_ids)."""
    width = max(lengths)
    real = np.arange(width)[None] >= width - np.asarray(lengths)[:, None]
    tokens = np.where(real, rng.integers(1, VOCAB, (len(lengths), width)), 0)
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    return tokens, real, positions


def twins(cfg: TransformerConfig, seed: int = 0):
    """(torch twin with random non-trivial weights, Flax model, its converted params)."""
    torch.manual_seed(seed)
    torch_model = tr.TransformerLM(cfg).double().eval()
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            param.add_(torch.randn_like(param) * (0.3 if "norm" in name else 0.05))
    model = TransformerLM(cfg)
    params = convert_module(torch_model, model, np.zeros((1, 4), np.int64))
    return torch_model, model, params


def both_logits(cfg, rng):
    torch_model, model, params = twins(cfg)
    tokens, real, positions = left_padded(rng)
    causal = np.tril(np.ones((tokens.shape[1],) * 2, bool))[None, None]
    mask = causal & real[:, None, None, :]
    flax = np.asarray(model.apply(params, tokens, mask=mask, positions=positions))
    with torch.no_grad():
        ref = torch_model(
            torch.from_numpy(tokens), torch.from_numpy(mask), torch.from_numpy(positions)
        ).numpy()
    return flax[real], ref[real], (model, params, tokens, mask, positions, real)


# The cells whose switch has an "off" to compare with (GQA and MQA are fewer heads, a tied
# head another layout: their twin test is the check).
SWITCHED_OFF = dict(
    rope_scaling="default",
    rope_theta=10000.0,
    sliding_window=None,
    sliding_window_from_layer=0,
    qk_norm=False,
    norm_weight_offset=False,
    attention_logit_softcap=None,
    final_logit_softcap=None,
    attention_scale_dim=None,
    sliding_window_pattern=None,
    rope_local_theta=None,
    sublayer_output_norm=False,
    rotary_fraction=1.0,
)
NO_OFF = ("rotary_default", "tied_head", "mqa", "gqa", "qkv_bias")


# Gemma's and Phi-3's cells run in the slow pass (the fast suite's budget;
# tests/test_hf_llms.py checks Gemma 2 against transformers in the fast one).
SLOW_CELLS = ("norm_weight_offset", "attention_logit_softcap", "final_logit_softcap")
SLOW_CELLS += ("attention_scale_dim", "sliding_window_pattern", "rope_local_theta")
SLOW_CELLS += ("sublayer_output_norm", "rotary_fraction", "rope_longrope")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CELLS else n for n in CELLS]
)
def test_switch_in_both_twins_and_it_changes_the_function(name):
    """Flax and torch agree at 1e-12; the same weights with the switch off give other logits
    (a switch both twins ignored would pass the parity check)."""
    rng = np.random.default_rng(0)
    cfg = config(**CELLS[name])
    flax, ref, (model, params, tokens, mask, positions, real) = both_logits(cfg, rng)
    assert_close(flax, ref, **F64, what=f"{name}: Flax vs torch logits")
    attn = params["params"]["decoder"]["layers_0"]["self_attn"]
    assert attn["key"]["kernel"].shape[1] == cfg.kv_heads * cfg.head_dim
    if name in NO_OFF:
        return
    other = TransformerLM(cfg.replace(**SWITCHED_OFF))
    changed = np.asarray(other.apply(params, tokens, mask=mask, positions=positions))[real]
    assert np.max(np.abs(changed - flax)) > 1e-3, name


def test_fused_attention_takes_grouped_heads_and_the_window():
    """attention_impl "fused" (jax.nn.dot_product_attention, torch's scaled_dot_product_attention
    with enable_gqa; what "auto" takes on a GPU) with grouped heads and a window. JAX's fused
    kernel rounds through float32 on the CPU even in float64 (5e-8 relative with or without
    these switches, measured), hence float32's tolerance here."""
    rng = np.random.default_rng(0)
    flax, ref, _ = both_logits(
        config(attention_impl="fused", num_kv_heads=2, sliding_window=3), rng
    )
    assert_close(flax, ref, rtol=1e-6, what="fused GQA + window: Flax vs torch logits")


def test_sliding_window_from_layer_changes_which_layers_slide():
    rng = np.random.default_rng(0)
    cfg = config(**CELLS["sliding_window_from_layer"])
    flax, _, (_, params, tokens, mask, positions, real) = both_logits(cfg, rng)
    every = TransformerLM(cfg.replace(sliding_window_from_layer=0))
    out = np.asarray(every.apply(params, tokens, mask=mask, positions=positions))[real]
    assert np.max(np.abs(out - flax)) > 1e-3


@pytest.mark.slow
def test_the_sliding_pattern_and_the_local_rope_base_each_matter():
    """Gemma 2/3's local / global layers: the pattern's own layers slide (every layer sliding
    gives other logits), and the sliding layers turn by their own base (the global base
    everywhere gives other logits)."""
    rng = np.random.default_rng(0)
    cfg = config(**CELLS["rope_local_theta"])
    flax, _, (_, params, tokens, mask, positions, real) = both_logits(cfg, rng)
    for changed in (dict(sliding_window_pattern="s"), dict(rope_local_theta=None)):
        other = TransformerLM(cfg.replace(**changed))
        out = np.asarray(other.apply(params, tokens, mask=mask, positions=positions))[real]
        assert np.max(np.abs(out - flax)) > 1e-3, changed


def test_gemma_and_phi3_switches_are_checked():
    with pytest.raises(ValueError, match="sliding_window_pattern must be letters 's'"):
        config(sliding_window=3, sliding_window_pattern="sx")
    with pytest.raises(ValueError, match="exclude each other"):
        config(sliding_window=3, sliding_window_pattern="sf", sliding_window_from_layer=1)
    with pytest.raises(ValueError, match="rope_local_theta needs positional='rotary'"):
        config(positional="learned", rope_local_theta=10.0)
    with pytest.raises(ValueError, match="attention_logit_softcap must be"):
        config(attention_logit_softcap=0.0)
    with pytest.raises(ValueError, match="needs rope_long_factors: 3 numbers"):
        config(**{**CELLS["rope_longrope"], "rope_long_factors": (1.0, 2.0)})
    with pytest.raises(ValueError, match="must turn an even number of dims"):
        config(rotary_fraction=0.5)  # 3 of 6
    longrope = config(**CELLS["rope_longrope"])  # its tables survive config.json (lists)
    assert TransformerConfig.from_json(longrope.to_json()) == longrope


def test_offset_norms_start_at_the_identity_scale():
    """An offset norm's weight initialises to 0 (1 + 0): in both twins a fresh one computes
    what the plain norm with its weight at 1 does."""
    from flax_transformer.nn.layers import RMSNorm
    from torch_reference.attention import RMSNorm as RMSNormTwin

    x = np.random.default_rng(0).standard_normal((2, 3, 6))
    with jax.enable_x64(True):
        offset = RMSNorm(weight_offset=True, dtype="float64", param_dtype="float64")
        params = offset.init(jax.random.PRNGKey(0), x)
        plain = RMSNorm(dtype="float64", param_dtype="float64")
        ones = plain.init(jax.random.PRNGKey(0), x)
        assert not np.any(params["params"]["scale"]) and np.all(ones["params"]["scale"] == 1)
        flax = np.asarray(offset.apply(params, x))
        assert_close(flax, np.asarray(plain.apply(ones, x)), **F64, what="offset norm at init")
    twin = RMSNormTwin(6, 1e-6, weight_offset=True).double()
    assert not torch.any(twin.weight)
    with torch.no_grad():
        assert_close(twin(torch.from_numpy(x)).numpy(), flax, **F64, what="torch offset norm")


def test_tied_head_has_no_lm_head_and_mqa_one_kv_head():
    _, _, params = twins(config(tie_output=True, num_kv_heads=1))
    assert "lm_head" not in params["params"]
    key = params["params"]["decoder"]["layers_0"]["self_attn"]["key"]["kernel"]
    assert key.shape == (24, 6)  # one head of 24 / 4


def test_qkv_bias_without_out_bias():
    _, _, params = twins(config(qkv_bias=True))
    attn = params["params"]["decoder"]["layers_0"]["self_attn"]
    assert {n for n in attn if "bias" in attn[n]} == {"query", "key", "value"}
    assert "bias" not in params["params"]["decoder"]["layers_0"]["ffn"]["linear1"]


ROPE_PARAMETERS = {
    "default": {},
    "linear": dict(factor=2.5),
    "llama3": dict(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    ),
    "yarn": dict(factor=4.0, original_max_position_embeddings=8),
    "yarn_mscale": dict(factor=4.0, original_max_position_embeddings=8, mscale=1.0,
                        mscale_all_dim=0.5),
    "dynamic": dict(factor=3.0),
}  # fmt: skip


@pytest.mark.parametrize("rule", list(ROPE_PARAMETERS))
def test_rotary_frequencies_are_transformers(rule):
    """inv_freq and the attention factor of every rule against transformers' functions (which
    compute in float32: agreement to float32 rounding), for the dynamic rule at a sequence
    longer than max_position_embeddings."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = rule.split("_")[0]
    extra = ROPE_PARAMETERS[rule]
    hf = LlamaConfig(
        hidden_size=24, num_attention_heads=2, head_dim=12, max_position_embeddings=6 if
        rope_type == "dynamic" else 64,
        rope_parameters=dict(rope_type=rope_type, rope_theta=500.0, **extra),
    )  # fmt: skip
    ours = config(
        attention_head_dim=12,
        num_heads=2,
        rope_theta=500.0,
        rope_scaling=rope_type,
        rope_factor=extra.get("factor", 1.0),
        rope_original_max_len=extra.get("original_max_position_embeddings", 6),
        rope_low_freq_factor=extra.get("low_freq_factor", 1.0),
        rope_high_freq_factor=extra.get("high_freq_factor", 4.0),
        rope_mscale=extra.get("mscale"),
        rope_mscale_all_dim=extra.get("mscale_all_dim"),
    )
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        theirs, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    elif rope_type == "dynamic":
        theirs, factor = ROPE_INIT_FUNCTIONS[rope_type](hf, seq_len=torch.tensor(20))
    else:
        theirs, factor = ROPE_INIT_FUNCTIONS[rope_type](hf)
    if rope_type == "dynamic":
        mine = rotary.dynamic_frequencies(ours, 20, np)
    else:
        mine = rotary.inverse_frequencies(ours)
    assert_close(mine, theirs.double().numpy(), rtol=3e-7, what=f"{rule} inv_freq")
    assert rotary.attention_factor(ours) == pytest.approx(factor, rel=1e-12)
    assert rule != "yarn" or factor > 1.0  # yarn's factor is not 1: a real check


def test_rope_scaling_needs_its_parameters():
    with pytest.raises(ValueError, match="rope_scaling 'yarn' needs rope_original_max_len"):
        config(rope_scaling="yarn", rope_factor=2.0)
    with pytest.raises(ValueError, match="num_heads \\(4\\) must be a multiple of num_kv_heads"):
        config(num_kv_heads=3)
    with pytest.raises(ValueError, match="needs positional='rotary'"):
        config(positional="learned", rope_scaling="linear")
    with pytest.raises(ValueError, match="even head_dim"):
        config(attention_head_dim=5)


DECODING_CELLS = {
    "gqa_window_from_layer": dict(num_kv_heads=2, sliding_window=3, sliding_window_from_layer=1),
    "mqa_yarn_qk_norm": dict(YARN, num_kv_heads=1, qk_norm=True, attention_head_dim=10),
    # Gemma 2/3: local (window 3, own rope base) and global layers, soft-capping, out norms.
    "gemma_local_global": dict(
        YARN,
        num_kv_heads=2,
        sliding_window=3,
        sliding_window_pattern="sf",
        rope_local_theta=50.0,
        attention_logit_softcap=0.5,
        final_logit_softcap=0.5,
        attention_scale_dim=6.0,
        sublayer_output_norm=True,
        norm_weight_offset=True,
        qk_norm=True,
    ),  # fmt: skip
}


@pytest.mark.parametrize(
    "name",
    [
        "gqa_window_from_layer",
        pytest.param("gemma_local_global", marks=pytest.mark.slow),
        pytest.param("mqa_yarn_qk_norm", marks=pytest.mark.slow),
    ],
)
def test_cached_decoding_is_the_full_forward(name):
    """Token by token through the KV cache (a right-aligned layout: each row's tokens at its
    true positions, as the engine feeds them) equals the full forward at every position; the
    cache holds num_kv_heads heads."""
    cfg = config(**DECODING_CELLS[name], max_len=16)
    _, model, params = twins(cfg)
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, VOCAB, (2, 12))
    full = np.asarray(
        model.apply(params, tokens, mask=np.tril(np.ones((12, 12), bool))[None, None])
    )
    cache = init_cache(model, 2, 16)
    key = cache["decoder"]["layers_0"]["self_attn"]["cached_key"]
    assert key.shape == (2, cfg.kv_heads, 16, cfg.head_dim)
    step = jax.jit(
        lambda c, t: model.apply({**params, "cache": c}, t, decode=True, mutable=["cache"])
    )
    logits, state = step(cache, tokens[:, :5])  # a prefill of 5, then one token at a time
    outs = [np.asarray(logits)]
    cache = state["cache"]
    for i in range(5, 12):
        logits, state = step(cache, tokens[:, i : i + 1])
        outs.append(np.asarray(logits))
        cache = state["cache"]
    assert_close(np.concatenate(outs, axis=1), full, **F64, what=f"{name}: cached vs full")


def test_gqa_cache_is_smaller_by_heads_over_kv_heads():
    """The KV cache of a grouped-query model holds num_kv_heads heads: num_heads / num_kv_heads
    times fewer bytes than the same model with one key / value head per query head."""

    def cache_bytes(cfg):
        cache = init_cache(TransformerLM(cfg), 3, 16)
        return sum(x.nbytes for x in jax.tree.leaves(cache) if x.ndim == 4)

    full = cache_bytes(config())
    assert cache_bytes(config(num_kv_heads=2)) * 2 == full
    assert cache_bytes(config(num_kv_heads=1)) * 4 == full


def test_grouped_attention_equals_tiled_keys():
    """Grouped-query attention is multi-head attention on keys / values repeated per group."""
    from flax_transformer.nn.attention import scaled_dot_product_attention

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 5, 6, 4)))
    k = jnp.asarray(rng.standard_normal((2, 7, 2, 4)))
    v = jnp.asarray(rng.standard_normal((2, 7, 2, 4)))
    mask = jnp.asarray(rng.random((2, 1, 5, 7)) > 0.3)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    tiled, tiled_weights = scaled_dot_product_attention(
        q, jnp.repeat(k, 3, axis=2), jnp.repeat(v, 3, axis=2), mask
    )
    assert_close(np.asarray(out), np.asarray(tiled), rtol=1e-14, what="grouped output")
    assert_close(np.asarray(weights), np.asarray(tiled_weights), rtol=1e-14, what="weights")
