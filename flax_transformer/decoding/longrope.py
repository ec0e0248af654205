"""Phi-3's longrope switch-over during generation: the steppers that go over to the long table.

A longrope model picks its rotary table per forward call from seq_len = max(position) + 1: the
short factors while seq_len <= original_max_position_embeddings (O, config.rope_original_max_len),
the long ones past it. A cached key keeps the table of the call that computed it, so
transformers' generate, for one row without padding, drops its cache once, at the step that
feeds position O (seq_len O + 1), and runs the whole sequence again there on the long table;
a prompt longer than O is on the long table from the prefill on.

`switching_stepper` is that stepper for rows with a switch position each (`long_from` (R,):
fed on the short table below it, on the long one from it, the row's whole sequence run again
there when `recompute`); hf/longrope_generation.py gives it transformers' batch-wide positions
(left padding), `stepper_for_rows_alone` gives it each row's own (`generate`: every row as
transformers generates it alone, so a row's tokens do not depend on its batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flax_transformer.decoding.cache import (
    CachedState,
    Stepper,
    cached_stepper,
    gather_beams,
    init_cache,
    uncached_stepper,
)


def tables(model):
    """(the model on the short table only, the model on the long table only)."""
    cfg = model.config
    short, long = cfg.rope_short_factors, cfg.rope_long_factors
    return model.clone(config=cfg.replace(rope_long_factors=short)), model.clone(
        config=cfg.replace(rope_short_factors=long)
    )


def plan_rows_alone(config, lengths, cache_len: int) -> tuple[str, bool]:
    """How an LM generates prompts of `lengths` (B,) (each from position 0) with a cache of
    cache_len positions, each row as transformers generates it alone: (mode, long_prompts).
    mode: "plain" (not longrope, or no position fed reaches O: the model as it is), "long"
    (every prompt passes O: the long table throughout) or "switch" (stepper_for_rows_alone;
    long_prompts: some prompt may pass O). Traced lengths (jax.export) give "switch" with
    long_prompts unless the cache stays below O."""
    original = config.rope_original_max_len
    if config.rope_scaling != "longrope" or cache_len <= original:
        return "plain", False
    if not isinstance(lengths, np.ndarray):
        return "switch", True
    if lengths.min() > original:
        return "long", False
    return "switch", bool(lengths.max() > original)


def stepper_for_rows_alone(
    model, variables, lengths, cache_len: int, use_cache: bool, long_prompts: bool
) -> Stepper:
    """The stepper of plan "switch": each row as transformers generates it alone. KV-cached: a
    row whose prompt passes O on the long table from its prefill (long_from 0; `long_prompts`
    says whether a row may be one), the others go over at position O with a re-run. The
    recomputing stepper (use_cache=False, the reference) runs every call on the table of the
    position whose logits it gives: long from O on."""
    original = model.config.rope_original_max_len
    if use_cache:
        long_from = jnp.where(jnp.asarray(lengths) > original, 0, original).astype(jnp.int32)
        return switching_stepper(
            model, variables, cache_len, long_from, True, long_prefill=long_prompts
        )
    short, long = (uncached_stepper(m, variables, None, cache_len) for m in tables(model))

    def start(prefix):  # logits at prefix_len - 1: only a row of that length uses them
        return (long if prefix.shape[1] > original else short).start(prefix)

    def feed(state, token, pos):
        return jax.lax.cond(pos >= original, long.feed, short.feed, state, token, pos)

    return Stepper(start, feed, short.lengths, short.grow)


@struct.dataclass
class SwitchState:
    """The cached stepper's state, every token so far (to run a row again) and each row's
    first position on the long table."""

    inner: CachedState
    buffer: jax.Array  # (R, cache_len) the tokens fed so far, zeros after them
    long_from: jax.Array  # (R,)

    def for_beams(self, beams: int) -> SwitchState:
        """Each row repeated for its `beams` beams (rows (R,) -> (R * beams,))."""
        tile = lambda x: jnp.repeat(x, beams, axis=0)  # noqa: E731
        return SwitchState(self.inner.for_beams(beams), tile(self.buffer), tile(self.long_from))

    def reordered(self, beam_index: jax.Array) -> SwitchState:
        """Beams follow their parents (long_from is the same for the beams of a row)."""
        batch, beams = beam_index.shape
        rows = self.buffer.reshape(batch, beams, -1)
        buffer = gather_beams(rows, beam_index).reshape(self.buffer.shape)
        return self.replace(inner=self.inner.reordered(beam_index), buffer=buffer)

    def grown(self, length: int) -> SwitchState:
        """The cache grown to `length` positions; the token buffer keeps its size."""
        return self.replace(inner=self.inner.grown(length))


def _rows_where(use, a, b):
    """a's leaves in the rows where `use` (R,), b's elsewhere; scalars (the cache indices,
    equal in both) from a."""

    def pick(x, y):
        if x.ndim == 0:
            return x
        return jnp.where(use.reshape((-1,) + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(pick, a, b)


def switching_stepper(
    model, variables, cache_len: int, long_from, recompute: bool, *, long_prefill: bool = False
) -> Stepper:
    """A KV-cached stepper for an LM whose rows go over to longrope's long table at their
    position long_from (R,): fed on the short table below it, on the long one from it; where
    `recompute`, the row's whole sequence is run again on the long table at that position.
    Each long_from is at least the prefix length, or, with `long_prefill`, 0 (the row's
    prefix on the long table too)."""
    short_model, long_model = tables(model)
    short = cached_stepper(short_model, variables, None, cache_len)
    long = cached_stepper(long_model, variables, None, cache_len)

    def start(prefix):
        long_from_rows = jnp.asarray(long_from)
        logits, inner = short.start(prefix)
        if long_prefill:  # the rows with long_from 0: their prefix on the long table
            on_long = long_from_rows < prefix.shape[1]
            logits_long, inner_long = long.start(prefix)
            logits = jnp.where(on_long[:, None], logits_long, logits)
            inner = _rows_where(on_long, inner_long, inner)
        buffer = jnp.zeros((prefix.shape[0], cache_len), jnp.int32)
        buffer = buffer.at[:, : prefix.shape[1]].set(prefix.astype(jnp.int32))
        return logits, SwitchState(inner, buffer, long_from_rows)

    def run_again(state: SwitchState, pos):
        """The logits at pos and a cache of every row's tokens 0..pos, all on the long table
        (transformers' re-run after dropping its cache)."""
        length = _cache_length(state.inner.cache)
        cache = init_cache(long_model, state.buffer.shape[0], length)
        logits, new = long_model.apply(
            {**variables, "cache": cache}, state.buffer[:, :length], decode=True, mutable=["cache"]
        )
        index = lambda x: jnp.full(x.shape, pos + 1, x.dtype) if x.ndim == 0 else x  # noqa: E731
        at_pos = jax.lax.dynamic_index_in_dim(logits, pos, axis=1, keepdims=False)
        return at_pos, state.inner.replace(cache=jax.tree.map(index, new["cache"]))

    def mixed(state: SwitchState, token, pos):
        logits_short, inner_short = short.feed(state.inner, token, pos)
        logits_long, inner_long = long.feed(state.inner, token, pos)
        on_long = pos >= state.long_from
        logits = jnp.where(on_long[:, None], logits_long, logits_short)
        inner = _rows_where(on_long, inner_long, inner_short)
        if recompute:
            switch = pos == state.long_from

            def again(_):
                logits_again, inner_again = run_again(state, pos)
                return (
                    jnp.where(switch[:, None], logits_again, logits),
                    _rows_where(switch, inner_again, inner),
                )

            logits, inner = jax.lax.cond(jnp.any(switch), again, lambda _: (logits, inner), 0)
        return logits, inner

    def feed(state: SwitchState, token, pos):
        state = state.replace(
            buffer=jax.lax.dynamic_update_slice(
                state.buffer, token[:, None].astype(jnp.int32), (jnp.zeros_like(pos), pos)
            )
        )
        all_short = jnp.all(pos < state.long_from)
        all_long = jnp.all(pos > state.long_from) if recompute else jnp.all(pos >= state.long_from)
        branch = jnp.where(all_short, 0, jnp.where(all_long, 2, 1))
        logits, inner = jax.lax.switch(
            branch,
            [
                lambda: short.feed(state.inner, token, pos),
                lambda: mixed(state, token, pos),
                lambda: long.feed(state.inner, token, pos),
            ],
        )
        return logits, state.replace(inner=inner)

    return Stepper(start, feed, short.lengths, SwitchState.grown)


def _cache_length(cache) -> int:
    """The slots of the self-attention caches now (they grow: decoding.cache)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
        if getattr(path[-1], "key", None) == "cached_key":
            return leaf.shape[2]
    raise ValueError("longrope generation: the model's cache has no cached_key")
