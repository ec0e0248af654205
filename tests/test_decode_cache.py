"""The KV cache: cached logits at every step equal full-recompute logits (float32, 1e-5).

Each case feeds a fixed token sequence through the cache in chunks (a multi-token prefill,
then one token per call, or other splits) and compares every position's logits with one
forward pass of the whole sequence. Both run in one compiled program per case; the weights are
random numpy arrays of the model's shapes (no init to compile).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import init_cache
from flax_transformer.nn.attention import make_causal_mask
from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.presets import preset

PAD = 0


def make_config(**changes) -> TransformerConfig:
    """The tiny preset with two decoder layers (caches of more than one layer), vocab 43/47."""
    base = dict(src_vocab_size=43, tgt_vocab_size=47, num_decoder_layers=2, d_ff=72, max_len=24)
    return preset("tiny", **{**base, **changes})


def random_variables(model, rng: np.random.Generator) -> dict:
    """Random weights of the model's shapes (eval_shape, then numpy: nothing is compiled)."""
    return jax.tree.map(
        lambda s: rng.normal(0.0, 0.3, s.shape).astype(s.dtype), abstract_variables(model)
    )


def build(kind: str, config: TransformerConfig, batch: int = 3, src_len: int = 9, seed: int = 0):
    """Model, params, ragged source (B, S) (None for the LM) and target tokens (B, 12)."""
    rng = np.random.default_rng(seed)
    model = model_for(config, "lm" if kind == "lm" else "seq2seq")
    params = random_variables(model, rng)
    tgt = rng.integers(1, config.tgt_vocab_size, (batch, 12))
    if kind == "lm":
        return model, params, None, tgt
    src = rng.integers(1, config.src_vocab_size, (batch, src_len))
    src[1, 5:] = PAD  # ragged sources: the cross-attention mask matters
    return model, params, src, tgt


def _feed(model, params, src_mask, cache, encoded, tokens):
    """One cached call: tokens (B, n) -> logits (B, n, V) and the updated cache."""
    variables = {**params, "cache": cache}
    if src_mask is None:
        logits, new = model.apply(variables, tokens, decode=True, mutable=["cache"])
    else:
        logits, new = model.apply(
            variables,
            encoded,  # given on the first call only: the encoder output is projected once
            tokens,
            src_mask=src_mask,
            decode=True,
            method="decode",
            mutable=["cache"],
        )
    return logits, new["cache"]


def cached_logits(model, params, src, tgt, *, chunks, cache_len):
    """Logits (B, T, V) of tgt fed through the cache: the first chunks as given, then the
    remaining tokens one per call in a lax.scan."""
    batch = tgt.shape[0]
    src_mask = encoded = None
    if src is None:
        cache = init_cache(model, batch, cache_len)
    else:
        cache = init_cache(model, batch, cache_len, src_len=src.shape[1])
        src_mask = (src != PAD)[:, None, None, :]
        encoded = model.apply(params, src, src_mask=src_mask, method="encode")
    pieces, start = [], 0
    for size in chunks:
        logits, cache = _feed(model, params, src_mask, cache, encoded, tgt[:, start : start + size])
        pieces.append(logits)
        start, encoded = start + size, None

    def one_token(cache, token):  # token (B,)
        logits, cache = _feed(model, params, src_mask, cache, None, token[:, None])
        return cache, logits[:, 0]

    if start < tgt.shape[1]:
        _, rest = jax.lax.scan(one_token, cache, tgt[:, start:].T)  # (T - start, B, V)
        pieces.append(rest.transpose(1, 0, 2))
    return jnp.concatenate(pieces, axis=1)


def full_logits(model, params, src, tgt):
    causal = make_causal_mask(tgt.shape[1])  # no padding mask: tgt has no pads
    if src is None:
        return model.apply(params, tgt, mask=causal)
    return model.apply(params, src, tgt, tgt_mask=causal)


@functools.partial(jax.jit, static_argnames=("model", "chunks", "cache_len"))
def cached_and_full(model, params, src, tgt, *, chunks, cache_len):
    """(cached, full) logits (B, T, V): one compilation per case instead of two."""
    cached = cached_logits(model, params, src, tgt, chunks=chunks, cache_len=cache_len)
    return cached, full_logits(model, params, src, tgt)


CONFIGS = {
    "post-LN": {},
    "pre-LN, final norm, learned positions, tied shared embeddings, scaled, gelu": dict(
        norm_first=True,
        final_norm=True,
        positional="learned",
        tie_output=True,
        share_embeddings=True,
        tgt_vocab_size=43,
        scale_embeddings=True,
        activation="gelu",
    ),
    # T5 v1.0 / T5 v1.1-style: no positions but a relative bias shared by the layers (log
    # buckets from distance 2), RMS norm, gated FFN, no biases, unscaled logits.
    "T5-style, shared relative bias": dict(
        norm_first=True,
        final_norm=True,
        positional="none",
        relative_attention_buckets=8,
        relative_attention_max_distance=6,
        norm_type="rms",
        gated_ffn=True,
        activation="gelu_tanh",
        use_bias=False,
        scale_attention_logits=False,
        share_embeddings=True,
        tgt_vocab_size=43,
        tie_output=True,
        scale_decoder_output=True,
    ),
    # UMT5-style: one relative bias per layer.
    "UMT5-style, per-layer relative bias": dict(
        norm_first=True,
        final_norm=True,
        positional="none",
        relative_attention_buckets=8,
        relative_attention_max_distance=6,
        relative_attention_per_layer=True,
        norm_type="rms",
        use_bias=False,
        scale_attention_logits=False,
    ),
}
# How each config feeds its 12 tokens: (first chunks, cache_len); the rest go one per call.
FEEDS = {
    # A single first token, then uneven multi-token chunks on a filled cache; exactly full.
    "post-LN": ((1, 3, 2), 12),
    # A 5-token prefill in one call; the cache is longer than needed.
    "pre-LN, final norm, learned positions, tied shared embeddings, scaled, gelu": ((5,), 20),
    "T5-style, shared relative bias": ((1, 3, 2), 12),
    # The cache (20) shorter than max_len (24): the bias is cut to the cache.
    "UMT5-style, per-layer relative bias": ((5,), 20),
}


# A decoder-only LM with a relative bias (no Hugging Face family has one): in the slow suite.
SLOW_CASES = {
    ("lm", "T5-style, shared relative bias"),
    ("lm", "UMT5-style, per-layer relative bias"),
}


@pytest.mark.parametrize(
    "kind, name",
    [
        (k, n) if (k, n) not in SLOW_CASES else pytest.param(k, n, marks=pytest.mark.slow)
        for n in CONFIGS
        for k in ("seq2seq", "lm")
    ],
)
def test_cached_logits_equal_full_recompute_every_step(kind, name):
    config = make_config(**CONFIGS[name])
    model, params, src, tgt = build(kind, config)
    chunks, cache_len = FEEDS[name]
    actual, expected = cached_and_full(model, params, src, tgt, chunks=chunks, cache_len=cache_len)
    assert_close(actual, expected, atol=1e-5, what=f"{kind} cached vs full logits, {chunks}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_prefill_all_at_once(kind):
    model, params, src, tgt = build(kind, make_config(num_decoder_layers=1), seed=1)
    actual, expected = cached_and_full(model, params, src, tgt, chunks=(12,), cache_len=12)
    assert_close(actual, expected, atol=1e-5, what=f"{kind} all 12 tokens in one call")


@pytest.mark.slow
def test_cache_works_with_remat():
    model, params, src, tgt = build(
        "seq2seq", make_config(remat=True, num_encoder_layers=1, num_decoder_layers=1), seed=2
    )
    actual, expected = cached_and_full(model, params, src, tgt, chunks=(4,), cache_len=12)
    assert_close(actual, expected, atol=1e-5, what="remat cached vs full logits")


def test_init_cache_shapes_and_bad_sizes():
    config = make_config()
    model = model_for(config, "seq2seq")
    cache = init_cache(model, 2, 10, src_len=7)
    layer = cache["decoder"]["layers_1"]  # every layer has its own cache
    # heads first: (batch, heads, len, head_dim)
    assert layer["self_attn"]["cached_key"].shape == (2, 4, 10, 8)
    assert layer["cross_attn"]["cached_key"].shape == (2, 4, 7, 8)
    assert int(layer["self_attn"]["cache_index"]) == 0
    lm_cache = init_cache(model_for(config, "lm"), 3, 5)
    assert lm_cache["decoder"]["layers_1"]["self_attn"]["cached_value"].shape == (3, 4, 5, 8)
    with pytest.raises(ValueError, match="src_len"):
        init_cache(model, 2, 10)
    with pytest.raises(ValueError, match="max_len"):
        init_cache(model, 2, config.max_len + 1, src_len=7)


TIED = "pre-LN, final norm, learned positions, tied shared embeddings, scaled, gelu"


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_one_row_tied_output_equals_full_recompute(kind):
    """One row fed one token per call takes the tied output projection's matrix-vector path
    (model._tied_logits_one_row); its logits are the full forward pass's."""
    model, params, src, tgt = build(kind, make_config(**CONFIGS[TIED]), seed=3)
    src = None if src is None else src[1:2]  # the ragged row
    actual, expected = cached_and_full(model, params, src, tgt[1:2], chunks=(1,), cache_len=12)
    assert_close(actual, expected, atol=1e-5, what=f"{kind} one-row cached vs full logits")


def _step_with_weights(model, params, cache, src_mask, tokens):
    """One cached decoding step: logits (R, 1, V) and the sown attention weights."""
    logits, state = model.apply(
        {**params, "cache": cache}, None, tokens, src_mask=src_mask, decode=True,
        method="decode", mutable=["cache", "intermediates"],
    )  # fmt: skip
    return logits, state["intermediates"]


# ~14 s a case on 2 cores: long runs (`pytest -m slow`, CI); Hugging Face beam search's token
# identity (fast) goes through the same shared cache.
@pytest.mark.slow
@pytest.mark.parametrize("per_row_mask", [False, True])
def test_beams_share_the_cross_attention_cache(per_row_mask):
    """Beam search keeps one cross-attention cache row per source and G query rows per source
    row (CachedState.for_beams): logits and sown attention weights equal those of a cache
    tiled G times, with the source mask given per source row or per query row."""
    from flax_transformer.decoding.cache import CachedState

    beams = 4
    model, params, src, tgt = build("seq2seq", make_config(), seed=4)
    src_mask = (src != PAD)[:, None, None, :]
    encoded = model.apply(params, src, src_mask=src_mask, method="encode")
    cache = init_cache(model, src.shape[0], 12, src_len=src.shape[1])
    _, cache = _feed(model, params, src_mask, cache, encoded, tgt[:, :3])  # prefill 3 tokens
    shared = CachedState(cache, src_mask).for_beams(beams).cache
    cross = shared["decoder"]["layers_0"]["cross_attn"]["cached_key"]
    assert cross.shape[0] == src.shape[0]  # not tiled
    tiled = jax.tree.map(lambda x: jnp.repeat(x, beams, axis=0) if x.ndim else x, cache)
    tiled_mask = jnp.repeat(src_mask, beams, axis=0)
    tokens = np.random.default_rng(5).integers(1, 47, (src.shape[0] * beams, 1))
    actual = _step_with_weights(
        model, params, shared, tiled_mask if per_row_mask else src_mask, tokens
    )
    expected = _step_with_weights(model, params, tiled, tiled_mask, tokens)
    assert_close(actual[0], expected[0], atol=1e-6, what="logits, shared vs tiled cross cache")
    for got, want in zip(jax.tree.leaves(actual[1]), jax.tree.leaves(expected[1]), strict=True):
        assert got.shape == want.shape
        assert_close(got, want, atol=1e-6, what="attention weights, shared vs tiled")
