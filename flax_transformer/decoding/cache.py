"""The KV cache and the steppers: "tokens so far" -> next-token logits, cached or recomputed.

With the cache (the default) the decoder's self-attention keys/values are cached per layer and
the cross-attention keys/values of the encoder output are computed once (see
MultiHeadAttention). Without it (`use_cache=False`: the reference the tests and the decoding
benchmark compare against) every step reruns the decoder over the whole fixed-size token
buffer: static shapes under jit, causal mask.

A stepper's `start(prefix (B, m))` returns the logits after the prefix (B, V) and a state;
`feed(state, token (B,), pos)` returns the logits after `token`, which sits at position `pos`.
Every array in a state has the batch first (scalars excepted); beam search expands a state to
its beams with `state.for_beams(K)` and makes beams follow their parents with
`state.reordered(beam_index)`.

The KV cache grows: `stepper.lengths(m)` are the cache lengths a search goes through (32, 64,
128, ... up to cache_len), `start` sizes the cache for the first and `grow(state, n)` pads it
with empty slots to the next. Every step reads the whole static-length cache (attention) and
beam search moves it (the reorder), so a cache sized for max_length (511 slots for opus-mt)
would cost 16x a 32-slot one on every step of a sentence that ends after 30 tokens. The empty
slots are masked, so the results do not depend on the length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from flax_transformer.decoding.inputs import Source
from flax_transformer.kernels import beam_reorder
from flax_transformer.kernels.switches import KERNELS
from flax_transformer.nn.attention import make_causal_mask
from flax_transformer.nn.kinds import is_lm


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
    if is_lm(model):
        shapes = jax.eval_shape(lambda t: model.init(key, t, decode=True), tokens)
    else:
        if src_len is None:
            raise ValueError("init_cache for a seq2seq Transformer needs src_len")
        encoded = jax.ShapeDtypeStruct((batch_size, src_len, cfg.d_model), jnp.dtype(cfg.dtype))
        shapes = jax.eval_shape(
            lambda e, t: model.init(key, e, t, decode=True, method="decode"), encoded, tokens
        )
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


# The first cache length of a growing cache; each next one doubles it (`growing_lengths`).
FIRST_CACHE_LEN = 32


def growing_lengths(prefix_len: int, cache_len: int) -> tuple[int, ...]:
    """The cache lengths of a search that prefills `prefix_len` tokens and may feed tokens up
    to position cache_len - 1: the first holds the prefix and at least one more token, each
    next doubles it, the last is cache_len. E.g. (1, 64) -> (32, 64); (1, 511) -> (32, 64,
    128, 256, 511); (100, 511) -> (128, 256, 511)."""
    length = FIRST_CACHE_LEN
    while length <= prefix_len:
        length *= 2
    lengths = []
    while length < cache_len:
        lengths.append(length)
        length *= 2
    return (*lengths, cache_len)


@dataclasses.dataclass(frozen=True)
class Stepper:
    """A model's decoding calls: `start(prefix (B, m))` -> (logits (B, V), state), and
    `feed(state, token (R,), pos ())` -> (logits (R, V), state) after `token` at position pos.
    `lengths(m)` are the cache lengths of a search with an m-token prefix (the state `start`
    returns holds the first: feed positions below it); `grow(state, n)` makes room for
    positions below n."""

    start: Callable[[jax.Array], tuple[jax.Array, Any]]
    feed: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
    lengths: Callable[[int], tuple[int, ...]]
    grow: Callable[[Any, int], Any]


@struct.dataclass
class CachedState:
    """The KV-cached stepper's state: the `cache` collection and the source mask."""

    cache: dict  # the `cache` collection, leaves (B, ...) and scalar indices
    src_mask: jax.Array | None  # (B, 1, 1, S) for a seq2seq model, else None

    def for_beams(self, beams: int) -> CachedState:
        """Each row's state for its `beams` beams: the self-attention cache tiled to (B*K, ...);
        the cross-attention keys/values and the source mask stay (B, ...), shared by the
        beams of a row (MultiHeadAttention reads them once for all of them)."""
        tile = lambda x: jnp.repeat(x, beams, axis=0)  # noqa: E731
        return self.replace(cache=_map_per_beam(tile, self.cache))

    def reordered(self, beam_index: jax.Array) -> CachedState:
        """Every beam's cache follows its parent: beam_index (B, K), parents within the row.
        On the CPU each self-attention cache moves in place, only its filled slots
        (kernels.beam_reorder); elsewhere, and for any other per-beam leaf, a gather."""
        gather = lambda x: _gather_beams(x, beam_index)  # noqa: E731
        if not KERNELS.reorder.active():
            return self.replace(cache=_map_per_beam(gather, self.cache))
        return self.replace(cache=_reordered_in_place(self.cache, beam_index, gather))

    def grown(self, length: int) -> CachedState:
        """The self-attention keys/values (B, heads, n, head_dim) padded with empty slots to
        `length`; the cache index and the cross-attention keys/values as they are."""
        pad = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)])  # noqa: E731
        return self.replace(cache=_map_per_beam(pad, self.cache))


@struct.dataclass
class BufferState:
    """The recomputing stepper's state: the token buffer, and the encoder output and source
    mask of a seq2seq model."""

    buffer: jax.Array  # (B, cache_len) every token so far, zeros after them
    encoded: jax.Array | None  # (B, S, d_model) the encoder output, None for an LM
    src_mask: jax.Array | None  # (B, 1, 1, S), None for an LM

    def for_beams(self, beams: int) -> BufferState:
        """Each row's state for its `beams` beams: every leaf tiled to (B*K, ...)."""
        return jax.tree.map(lambda x: jnp.repeat(x, beams, axis=0), self)

    def reordered(self, beam_index: jax.Array) -> BufferState:
        """Every beam's buffer follows its parent: beam_index (B, K), parents within the row.
        encoded / src_mask are the same for every beam of a row: only the tokens move."""
        return self.replace(buffer=_gather_beams(self.buffer, beam_index))


def _map_per_beam(fn, cache: dict) -> dict:
    """fn on the cache leaves that differ between beams: not the scalar indices, not the
    cross-attention keys/values."""

    def leaf(path, x):
        if x.ndim == 0 or any(getattr(k, "key", None) == "cross_attn" for k in path):
            return x
        return fn(x)

    return jax.tree_util.tree_map_with_path(leaf, cache)


def _reordered_in_place(cache, beam_index: jax.Array, gather):
    """The cache with each self-attention's keys/values (B*K, heads, T, head_dim) reordered by
    the kernel up to its cache_index; the cross-attention's as they are (shared by the beams);
    any other leaf as `_map_per_beam` treats it."""
    if not isinstance(cache, Mapping):
        return cache if cache.ndim == 0 else gather(cache)
    if {"cached_key", "cached_value", "cache_index"} <= cache.keys():
        filled = cache["cache_index"]
        moved = {
            name: beam_reorder.reorder(cache[name], beam_index, filled)
            for name in ("cached_key", "cached_value")
        }
        return {**cache, **moved}
    return {
        name: node if name == "cross_attn" else _reordered_in_place(node, beam_index, gather)
        for name, node in cache.items()
    }


def gather_beams(x: jax.Array, index: jax.Array) -> jax.Array:
    """x (B, K', ...), index (B, K) -> (B, K, ...): for each row, its entries `index` picks."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _gather_beams(x: jax.Array, beam_index: jax.Array) -> jax.Array:
    """x (B*K, ...) -> the rows of the parents beam_index (B, K) picks within each row."""
    batch, beams = beam_index.shape
    x = x.reshape((batch, beams) + x.shape[1:])
    return gather_beams(x, beam_index).reshape((batch * beams,) + x.shape[2:])


def make_stepper(model, variables, source: Source | None, cache_len: int, use_cache: bool):
    """The KV-cached stepper (`use_cache`) or the recomputing one, for up to `cache_len`
    tokens; `source` is the encoder input of a seq2seq model, None for an LM."""
    make = cached_stepper if use_cache else uncached_stepper
    return make(model, variables, source, cache_len)


def cached_stepper(model, variables, source: Source | None, cache_len: int) -> Stepper:
    """Feeds one token per step through the KV cache; a seq2seq model encodes `source` once
    in `start`, which raises ValueError (init_cache) if cache_len exceeds the model's max_len."""
    with_cache = lambda cache: {**variables, "cache": cache}  # noqa: E731

    def apply(state: CachedState, encoded, tokens):  # tokens (B, n) -> logits (B, V), state
        if source is None:  # an LM
            logits, new = model.apply(
                with_cache(state.cache), tokens, decode=True, mutable=["cache"]
            )
        else:  # encoded is None after the first call: cross-attention keys/values are cached
            logits, new = model.apply(
                with_cache(state.cache),
                encoded,
                tokens,
                src_mask=state.src_mask,
                decode=True,
                method="decode",
                mutable=["cache"],
            )
        return logits[:, -1], state.replace(cache=new["cache"])

    def lengths(prefix_len):
        return growing_lengths(prefix_len, cache_len)

    def start(prefix):
        batch, first_len = prefix.shape[0], lengths(prefix.shape[1])[0]
        if source is None:
            return apply(CachedState(init_cache(model, batch, first_len), None), None, prefix)
        encoded = model.apply(variables, source.tokens, src_mask=source.mask, method="encode")
        cache = init_cache(model, batch, first_len, src_len=source.tokens.shape[1])
        return apply(CachedState(cache, source.mask), encoded, prefix)

    def feed(state, token, pos):
        del pos  # the cache index knows it
        return apply(state, None, token[:, None])

    return Stepper(start, feed, lengths, CachedState.grown)


def uncached_stepper(model, variables, source: Source | None, cache_len: int) -> Stepper:
    """Recomputes the decoder over the whole (B, cache_len) buffer for every token."""
    causal = make_causal_mask(cache_len)  # pads past `pos` are hidden by causality alone

    def logits_at(state: BufferState, pos):  # -> (B, V) the logits after position pos
        if source is None:
            logits = model.apply(variables, state.buffer, mask=causal)
        else:
            logits = model.apply(
                variables,
                state.encoded,
                state.buffer,
                src_mask=state.src_mask,
                tgt_mask=causal,
                method="decode",
            )
        return jax.lax.dynamic_index_in_dim(logits, pos, axis=1, keepdims=False)

    def start(prefix):
        batch, m = prefix.shape
        buffer = jnp.zeros((batch, cache_len), jnp.int32).at[:, :m].set(prefix)
        state = BufferState(buffer, None, None)
        if source is not None:
            encoded = model.apply(variables, source.tokens, src_mask=source.mask, method="encode")
            state = BufferState(buffer, encoded, source.mask)
        return logits_at(state, m - 1), state

    def feed(state, token, pos):
        buffer = jax.lax.dynamic_update_slice(  # zeros_like: a literal 0 is int64 under x64
            state.buffer, token[:, None].astype(jnp.int32), (jnp.zeros_like(pos), pos)
        )
        state = state.replace(buffer=buffer)
        return logits_at(state, pos), state

    # One length: this stepper is the plain reference the cached one is tested against.
    return Stepper(start, feed, lambda prefix_len: (cache_len,), lambda state, length: state)
