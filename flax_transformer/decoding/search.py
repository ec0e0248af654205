"""Autoregressive decoding: greedy, sampling and beam search, with or without the KV cache.

Both models decode through one loop. A *prompt* is what the decoder is fed before it chooses
freely: `[bos]` for the seq2seq `Transformer` (whose encoder runs once per source), the
right-padded prompt tokens for `TransformerLM`. The common prefix of the prompts
(`min(lengths)` tokens) is prefilled in one call; past that, an example whose prompt is longer
is *forced*: its prompt token is fed instead of a chosen one. So a ragged batch decodes exactly
as each example would alone.

Outputs are the `max_new_tokens` tokens after each prompt, int32 (batch, max_new_tokens): the
first EOS is kept, everything after it is pad. `eos_id=None` never stops early (benchmarks).

With the cache (default) the decoder's self-attention keys/values are cached per layer and the
cross-attention keys/values of the encoder output are computed once (see MultiHeadAttention).
Without it (`use_cache=False`, the reference and the benchmark's baseline) every step reruns the
decoder over the whole fixed-size token buffer: static shapes under jit, causal mask.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.nn.attention import make_causal_mask, make_padding_mask
from flax_transformer.nn.model import TransformerLM

NEG_INF = -jnp.inf


# ----------------------------------------------------------------------------------- the cache


def init_cache(
    model: nn.Module, batch_size: int, cache_len: int, *, src_len: int | None = None
) -> dict:
    """A zeroed `cache` collection for `batch_size` sequences of up to `cache_len` tokens.

    Built from the shapes of `model.init(..., decode=True)` (jax.eval_shape: no param is
    initialised, nothing runs). A seq2seq model needs `src_len` to size the cross-attention
    keys/values; the first decode call with the encoder output fills them.
    """
    cfg = model.config
    if cache_len > cfg.max_len:
        raise ValueError(f"cache_len {cache_len} is longer than the model's max_len {cfg.max_len}")
    tokens = jax.ShapeDtypeStruct((batch_size, cache_len), jnp.int32)
    key = jax.random.key(0)
    if isinstance(model, TransformerLM):
        shapes = jax.eval_shape(lambda t: model.init(key, t, decode=True), tokens)
    else:
        if src_len is None:
            raise ValueError("init_cache for a seq2seq Transformer needs src_len")
        encoded = jax.ShapeDtypeStruct((batch_size, src_len, cfg.d_model), jnp.dtype(cfg.dtype))
        shapes = jax.eval_shape(
            lambda e, t: model.init(key, e, t, decode=True, method="decode"), encoded, tokens
        )
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


# --------------------------------------------------------------------------------- steppers
# A stepper turns "tokens so far" into next-token logits. start(prefix (B, m)) returns the
# logits after the prefix (B, V) and a state; feed(state, token (B,), pos) returns the logits
# after `token`, which sits at position `pos`. Every array in the state has the batch first
# (scalars excepted), so beam search can tile and reorder it leaf by leaf.


@dataclasses.dataclass(frozen=True)
class _Stepper:
    start: Callable[[jax.Array], tuple[jax.Array, Any]]
    feed: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


def _cached_stepper(model, params, src, src_mask, cache_len: int) -> _Stepper:
    variables = lambda cache: {**params, "cache": cache}  # noqa: E731
    if isinstance(model, TransformerLM):

        def start(prefix):
            cache = init_cache(model, prefix.shape[0], cache_len)
            logits, new = model.apply(variables(cache), prefix, decode=True, mutable=["cache"])
            return logits[:, -1], new["cache"]

        def feed(cache, token, pos):
            del pos  # the cache index knows it
            logits, new = model.apply(
                variables(cache), token[:, None], decode=True, mutable=["cache"]
            )
            return logits[:, -1], new["cache"]

        return _Stepper(start, feed)

    def start_seq2seq(prefix):
        encoded = model.apply(params, src, src_mask=src_mask, method="encode")
        cache = init_cache(model, prefix.shape[0], cache_len, src_len=src.shape[1])
        logits, new = model.apply(
            variables(cache),
            encoded,
            prefix,
            src_mask=src_mask,
            decode=True,
            method="decode",
            mutable=["cache"],
        )
        return logits[:, -1], (new["cache"], src_mask)

    def feed_seq2seq(state, token, pos):
        cache, mask = state
        logits, new = model.apply(
            variables(cache),
            None,  # cross-attention keys/values come from the cache
            token[:, None],
            src_mask=mask,
            decode=True,
            method="decode",
            mutable=["cache"],
        )
        return logits[:, -1], (new["cache"], mask)

    return _Stepper(start_seq2seq, feed_seq2seq)


def _uncached_stepper(model, params, src, src_mask, cache_len: int) -> _Stepper:
    """Recomputes the decoder over the whole (B, cache_len) buffer for every token."""
    causal = make_causal_mask(cache_len)  # pads past `pos` are hidden by causality alone

    def full_logits(buffer, encoded, mask):
        if isinstance(model, TransformerLM):
            return model.apply(params, buffer, mask=causal)
        return model.apply(params, encoded, buffer, src_mask=mask, tgt_mask=causal, method="decode")

    def logits_at(logits, pos):  # (B, L, V) -> (B, V)
        return jax.lax.dynamic_index_in_dim(logits, pos, axis=1, keepdims=False)

    def start(prefix):
        batch, m = prefix.shape
        buffer = jnp.zeros((batch, cache_len), jnp.int32).at[:, :m].set(prefix)
        encoded = None
        if not isinstance(model, TransformerLM):
            encoded = model.apply(params, src, src_mask=src_mask, method="encode")
        logits = full_logits(buffer, encoded, src_mask)
        return logits_at(logits, m - 1), (buffer, encoded, src_mask)

    def feed(state, token, pos):
        buffer, encoded, mask = state
        buffer = jax.lax.dynamic_update_slice(buffer, token[:, None].astype(jnp.int32), (0, pos))
        return logits_at(full_logits(buffer, encoded, mask), pos), (buffer, encoded, mask)

    return _Stepper(start, feed)


# --------------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class _Settings:
    """Everything static about one search (hashable: it is a jit static argument)."""

    max_new_tokens: int
    prefix_len: int  # tokens prefilled in one call: the shortest prompt
    eos_id: int
    pad_id: int
    use_cache: bool = True
    strategy: str = "greedy"  # "greedy" | "sample" | "beam"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    beam_size: int = 1
    alpha: float = 0.6


def _choose(settings: _Settings, logits: jax.Array, key: jax.Array) -> jax.Array:
    """Next token (B,) from logits (B, V): argmax, or a sample after temperature/top-k/top-p."""
    if settings.strategy == "greedy" or settings.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / settings.temperature
    if settings.top_k:
        kth_best = jax.lax.top_k(logits, settings.top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_best, NEG_INF, logits)
    if settings.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose probability reaches top_p.
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = jnp.where(mass_before < settings.top_p, sorted_logits, jnp.inf)
        threshold = jnp.min(kept, axis=-1, keepdims=True)  # the least likely kept logit
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _prompt_token(prompt: jax.Array, pos: jax.Array) -> jax.Array:
    """prompt[:, pos] (B,), clamped inside the prompt (the value is only used where forced)."""
    pos = jnp.minimum(pos, prompt.shape[1] - 1)
    return jax.lax.dynamic_index_in_dim(prompt, pos, axis=1, keepdims=False)


# ----------------------------------------------------------------------- greedy and sampling


def _greedy_or_sample(stepper, prompt, lengths, rng, settings: _Settings) -> jax.Array:
    batch = prompt.shape[0]
    n_new = settings.max_new_tokens
    slots = jnp.arange(n_new)[None, :]

    def record(pos, logits, out, finished):
        """Choose (or force) the token at position `pos`; write it to the output."""
        forced = pos < lengths  # (B,)
        chosen = _choose(settings, logits, jax.random.fold_in(rng, pos))
        chosen = jnp.where(finished, settings.pad_id, chosen)
        token = jnp.where(forced, _prompt_token(prompt, pos), chosen)
        new_index = pos - lengths  # (B,) index among the new tokens, < 0 while forced
        out = jnp.where(slots == new_index[:, None], token[:, None], out)
        finished = finished | (~forced & (token == settings.eos_id))
        done = finished | (new_index >= n_new - 1)
        return token, out, finished, done

    logits, state = stepper.start(prompt[:, : settings.prefix_len])
    out = jnp.full((batch, n_new), settings.pad_id, jnp.int32)
    finished = jnp.zeros((batch,), bool)
    pos = jnp.array(settings.prefix_len, jnp.int32)
    token, out, finished, done = record(pos, logits, out, finished)

    def cond(carry):
        return ~jnp.all(carry[-1])

    def body(carry):
        pos, state, token, out, finished, _ = carry
        logits, state = stepper.feed(state, token, pos)
        token, out, finished, done = record(pos + 1, logits, out, finished)
        return pos + 1, state, token, out, finished, done

    carry = jax.lax.while_loop(cond, body, (pos, state, token, out, finished, done))
    return carry[3]


# ------------------------------------------------------------------------------ beam search


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT's ((5 + length) / 6) ** alpha; scores are log-probabilities divided by it."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _beam_search(stepper, prompt, lengths, settings: _Settings):
    """Beam search in a lax.while_loop. Returns tokens (B, K, N) and scores (B, K), best first.

    Each step ranks the 2K best continuations of the K live beams. A continuation ending in EOS
    joins the finished pool only if it ranks among the first K (so beam 1 is greedy); the K
    best others stay live. An example is done when its K finished hypotheses all score above
    the best score a live beam could still reach; the loop stops when every example is done
    or has produced max_new_tokens.
    """
    batch = prompt.shape[0]
    beams, n_new = settings.beam_size, settings.max_new_tokens
    alpha = settings.alpha
    best_possible_penalty = length_penalty(jnp.array(n_new), alpha)  # alpha >= 0: the largest

    def gather(x, index):  # x (B, K', ...), index (B, K) -> (B, K, ...)
        return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)

    def reorder_state(state, beam_index):  # leaves (B*K, ...) follow their chosen parent beam
        def leaf(x):
            if x.ndim == 0:
                return x
            x = x.reshape((batch, beams) + x.shape[1:])
            return gather(x, beam_index).reshape((batch * beams,) + x.shape[2:])

        return jax.tree.map(leaf, state)

    def step(carry, pos, logits):
        """Extend the beams with the token at position `pos`; logits (B*K, V)."""
        live_seqs, live_logp, fin_seqs, fin_scores, fin_flags = carry
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beams, vocab)
        forced = pos < lengths  # (B,)
        forced_only = jnp.where(
            jnp.arange(vocab) == _prompt_token(prompt, pos)[:, None, None], 0.0, NEG_INF
        )
        logp = jnp.where(forced[:, None, None], forced_only, logp)
        candidates = (live_logp[:, :, None] + logp).reshape(batch, beams * vocab)
        top_logp, top_index = jax.lax.top_k(candidates, 2 * beams)  # (B, 2K)
        parent, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        new_index = pos - lengths  # (B,)
        writes = jnp.arange(n_new)[None, None, :] == new_index[:, None, None]
        top_seqs = jnp.where(writes, token[:, :, None], gather(live_seqs, parent))  # (B,2K,N)
        is_eos = (token == settings.eos_id) & ~forced[:, None]
        active = (new_index >= 0) & (new_index < n_new)  # (B,) not forced, not past the end

        # Finished pool: EOS continuations ranked among the first K, length-normalised.
        accept = is_eos & (jnp.arange(2 * beams) < beams)[None] & active[:, None]
        new_scores = top_logp / length_penalty(new_index + 1, alpha)[:, None]
        pool_scores = jnp.concatenate([fin_scores, jnp.where(accept, new_scores, NEG_INF)], 1)
        pool_seqs = jnp.concatenate([fin_seqs, top_seqs], axis=1)
        pool_flags = jnp.concatenate([fin_flags, accept], axis=1)
        fin_scores, keep = jax.lax.top_k(pool_scores, beams)
        fin_seqs, fin_flags = gather(pool_seqs, keep), gather(pool_flags, keep)

        # Live beams: the K best continuations that did not end.
        live_logp_next, keep = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), beams)
        live_seqs = gather(top_seqs, keep)
        next_token = gather(token, keep)  # (B, K)
        beam_index = gather(parent, keep)
        live_logp = live_logp_next

        done = (new_index >= n_new - 1) | jnp.all(
            fin_flags & (fin_scores > live_logp[:, :1] / best_possible_penalty), axis=1
        )
        return (live_seqs, live_logp, fin_seqs, fin_scores, fin_flags), next_token, beam_index, done

    def freeze(old, new, active):  # examples past their last token keep their results
        return jax.tree.map(
            lambda o, n: jnp.where(active.reshape((batch,) + (1,) * (n.ndim - 1)), n, o), old, new
        )

    tile = lambda x: jnp.repeat(x, beams, axis=0) if x.ndim else x  # noqa: E731
    logits, state = stepper.start(prompt[:, : settings.prefix_len])
    logits, state = tile(logits), jax.tree.map(tile, state)
    empty = jnp.full((batch, beams, n_new), settings.pad_id, jnp.int32)
    first_live = jnp.where(jnp.arange(beams) == 0, 0.0, NEG_INF)  # identical beams: keep one
    beam_carry = (
        empty,
        jnp.broadcast_to(first_live, (batch, beams)),
        empty,
        jnp.full((batch, beams), NEG_INF),
        jnp.zeros((batch, beams), bool),
    )
    pos = jnp.array(settings.prefix_len, jnp.int32)
    beam_carry, token, beam_index, done = step(beam_carry, pos, logits)
    state = reorder_state(state, beam_index)

    def cond(carry):
        return ~jnp.all(carry[-1])

    def body(carry):
        pos, state, token, beam_carry, done = carry
        logits, state = stepper.feed(state, token.reshape(-1), pos)
        new_carry, token, beam_index, new_done = step(beam_carry, pos + 1, logits)
        beam_carry = freeze(beam_carry, new_carry, ~done)
        state = reorder_state(state, beam_index)
        return pos + 1, state, token, beam_carry, done | new_done

    carry = jax.lax.while_loop(cond, body, (pos, state, token, beam_carry, done))
    live_seqs, live_logp, fin_seqs, fin_scores, fin_flags = carry[3]
    # Examples without K finished hypotheses also rank their live beams (at full length).
    live_scores = live_logp / length_penalty(jnp.array(n_new), alpha)
    live_scores = jnp.where(jnp.all(fin_flags, axis=1, keepdims=True), NEG_INF, live_scores)
    scores, keep = jax.lax.top_k(jnp.concatenate([fin_scores, live_scores], axis=1), beams)
    return gather(jnp.concatenate([fin_seqs, live_seqs], axis=1), keep), scores


# ---------------------------------------------------------------------------------- driver


@functools.partial(jax.jit, static_argnames=("model", "settings"))
def _search(model, params, prompt, lengths, src, src_mask, rng, settings: _Settings):
    cache_len = prompt.shape[1] + settings.max_new_tokens - 1  # the last token is not fed
    make = _cached_stepper if settings.use_cache else _uncached_stepper
    stepper = make(model, params, src, src_mask, cache_len)
    if settings.strategy == "beam":
        return _beam_search(stepper, prompt, lengths, settings)
    return _greedy_or_sample(stepper, prompt, lengths, rng, settings)


def _check_common(model, max_new_tokens: int, eos_id: int | None) -> None:
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    vocab = model.config.tgt_vocab_size
    if eos_id is not None and not 0 <= eos_id < vocab:
        raise ValueError(f"eos_id {eos_id} is outside the target vocabulary (size {vocab})")


def _seq2seq_inputs(model, src, src_mask, max_new_tokens, bos_id, eos_id):
    """Validated (prompt, lengths, src, src_mask, settings kwargs) for a seq2seq model."""
    if isinstance(model, TransformerLM):
        raise ValueError("this function decodes a seq2seq Transformer; use the lm_* variants")
    _check_common(model, max_new_tokens, eos_id)
    cfg = model.config
    src = jnp.asarray(src)
    if src.ndim != 2 or not jnp.issubdtype(src.dtype, jnp.integer):
        raise ValueError(f"src must be (batch, length) integer token ids, got {src.shape}")
    if src.shape[1] > cfg.max_len:
        raise ValueError(f"src has length {src.shape[1]}, longer than max_len {cfg.max_len}")
    if max_new_tokens > cfg.max_len:
        raise ValueError(f"max_new_tokens {max_new_tokens} is longer than max_len {cfg.max_len}")
    batch = src.shape[0]
    if src_mask is None:
        src_mask = make_padding_mask(src, cfg.pad_id)
    src_mask = jnp.asarray(src_mask)
    if jnp.issubdtype(src_mask.dtype, jnp.floating):
        raise ValueError("src_mask must be a boolean key mask (True = attend), not a float bias")
    try:  # the cross-attention key mask, one row per example (beam search tiles it)
        src_mask = jnp.broadcast_to(src_mask, (batch, 1, 1, src.shape[1]))
    except ValueError:
        raise ValueError(
            f"src_mask of shape {src_mask.shape} does not broadcast to (batch, 1, 1, src_len) "
            f"= {(batch, 1, 1, src.shape[1])}"
        ) from None
    prompt = jnp.full((batch, 1), bos_id, jnp.int32)
    lengths = jnp.ones((batch,), jnp.int32)
    return prompt, lengths, src.astype(jnp.int32), src_mask.astype(bool), 1


def _lm_inputs(model, prompts, lengths, max_new_tokens, eos_id):
    if not isinstance(model, TransformerLM):
        raise ValueError("the lm_* functions decode a TransformerLM")
    _check_common(model, max_new_tokens, eos_id)
    cfg = model.config
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer):
        raise ValueError(f"prompts must be (batch, length) integer token ids, got {prompts.shape}")
    if lengths is None:
        lengths = (prompts != cfg.pad_id).sum(axis=1)  # right-padded prompts
    lengths = np.asarray(lengths, dtype=np.int32)
    if lengths.shape != prompts.shape[:1]:
        raise ValueError(f"lengths {lengths.shape} must be (batch,) for prompts {prompts.shape}")
    if lengths.min() < 1 or lengths.max() > prompts.shape[1]:
        raise ValueError(
            f"every prompt needs 1..{prompts.shape[1]} tokens (start with BOS), got lengths "
            f"{lengths.tolist()}"
        )
    width = int(lengths.max())
    if width + max_new_tokens - 1 > cfg.max_len:
        raise ValueError(
            f"prompt length {width} + max_new_tokens {max_new_tokens} exceeds the model's "
            f"max_len {cfg.max_len} (+1)"
        )
    prompts = jnp.asarray(prompts[:, :width], jnp.int32)
    return prompts, jnp.asarray(lengths), int(lengths.min())


def _settings(model, prefix_len, max_new_tokens, eos_id, **kwargs) -> _Settings:
    return _Settings(
        max_new_tokens=int(max_new_tokens),
        prefix_len=prefix_len,
        eos_id=-1 if eos_id is None else int(eos_id),  # None: no EOS, always max_new_tokens
        pad_id=model.config.pad_id,
        **kwargs,
    )


def _sample_kwargs(temperature, top_k, top_p) -> dict:
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative int (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    return dict(strategy="sample", temperature=float(temperature), top_k=top_k, top_p=float(top_p))


def _beam_kwargs(beam_size, alpha) -> dict:
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if not alpha >= 0.0:
        raise ValueError(f"alpha (length penalty) must be >= 0, got {alpha}")
    return dict(strategy="beam", beam_size=beam_size, alpha=float(alpha))


# ------------------------------------------------------------------------------ public API


def greedy_decode(
    model,
    params,
    src,
    *,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    src_mask=None,
    use_cache: bool = True,
) -> jax.Array:
    """Greedy translation with a seq2seq Transformer.

    src (B, S) token ids padded with pad_id; params = {"params": ...}. Returns int32
    (B, max_new_tokens): the first EOS kept, pad after it.
    """
    prompt, lengths, src, src_mask, m = _seq2seq_inputs(
        model, src, src_mask, max_new_tokens, bos_id, eos_id
    )
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache)
    return _search(model, params, prompt, lengths, src, src_mask, jax.random.key(0), settings)


def sample_decode(
    model,
    params,
    src,
    *,
    rng: jax.Array,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    src_mask=None,
    use_cache: bool = True,
) -> jax.Array:
    """Sampled translation: softmax(logits / temperature) restricted to the top_k tokens
    (0 = all) and to the smallest set holding top_p of the mass (1 = all). Same rng, same
    output. temperature 0 is greedy."""
    kwargs = _sample_kwargs(temperature, top_k, top_p)
    prompt, lengths, src, src_mask, m = _seq2seq_inputs(
        model, src, src_mask, max_new_tokens, bos_id, eos_id
    )
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache, **kwargs)
    return _search(model, params, prompt, lengths, src, src_mask, rng, settings)


def beam_search(
    model,
    params,
    src,
    *,
    beam_size: int,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    alpha: float = 0.6,
    src_mask=None,
    use_cache: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Beam search translation. Returns tokens (B, beam_size, max_new_tokens) and scores
    (B, beam_size), best first; score = log-probability / ((5 + length) / 6) ** alpha."""
    kwargs = _beam_kwargs(beam_size, alpha)
    prompt, lengths, src, src_mask, m = _seq2seq_inputs(
        model, src, src_mask, max_new_tokens, bos_id, eos_id
    )
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache, **kwargs)
    return _search(model, params, prompt, lengths, src, src_mask, jax.random.key(0), settings)


def lm_greedy_decode(
    model, params, prompts, lengths=None, *, max_new_tokens: int, eos_id: int | None, use_cache=True
) -> jax.Array:
    """Greedy continuation of right-padded prompts (B, P) (each starting with BOS) by a
    TransformerLM. lengths (B,) defaults to the count of non-pad tokens; prompts and lengths
    are host values (the prefill length is a compile-time constant). Returns int32
    (B, max_new_tokens) new tokens, pad after the first EOS."""
    prompts, lengths, m = _lm_inputs(model, prompts, lengths, max_new_tokens, eos_id)
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache)
    return _search(model, params, prompts, lengths, None, None, jax.random.key(0), settings)


def lm_sample_decode(
    model,
    params,
    prompts,
    lengths=None,
    *,
    rng: jax.Array,
    max_new_tokens: int,
    eos_id: int | None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    use_cache: bool = True,
) -> jax.Array:
    """Sampled continuation of prompts by a TransformerLM (see sample_decode)."""
    kwargs = _sample_kwargs(temperature, top_k, top_p)
    prompts, lengths, m = _lm_inputs(model, prompts, lengths, max_new_tokens, eos_id)
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache, **kwargs)
    return _search(model, params, prompts, lengths, None, None, rng, settings)


def lm_beam_search(
    model,
    params,
    prompts,
    lengths=None,
    *,
    beam_size: int,
    max_new_tokens: int,
    eos_id: int | None,
    alpha: float = 0.6,
    use_cache: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Beam search continuation of prompts by a TransformerLM (see beam_search)."""
    kwargs = _beam_kwargs(beam_size, alpha)
    prompts, lengths, m = _lm_inputs(model, prompts, lengths, max_new_tokens, eos_id)
    settings = _settings(model, m, max_new_tokens, eos_id, use_cache=use_cache, **kwargs)
    return _search(model, params, prompts, lengths, None, None, jax.random.key(0), settings)
