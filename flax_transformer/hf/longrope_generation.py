"""Phi-3's longrope switch-over during generation, as transformers' generate makes it.

transformers picks longrope's table per forward call from seq_len = max(position_ids) + 1 over
the whole batch: the short factors while it is <= original_max_position_embeddings (O), the
long ones past it (modeling_rope_utils.longrope_frequency_update). A cached key keeps the table
of the call that computed it, so Phi3ForCausalLM.prepare_inputs_for_generation drops the cache
once, at the step whose input_ids reach O + 1 columns while at most O are cached, and the whole
sequence runs again (on the long table when a row has no left padding).

This engine feeds each row at its own real position (prompts right-aligned to position 0), so
transformers' batch-wide column becomes a per-row position: with W the prompt width and m the
smallest left padding, row r's column is pos + pads[r] and its call's seq_len is
pos + pads[r] + 1 - m. Hence, per row, `long_from[r] = O + m - pads[r]`: the first position fed
on the long table; below it the short one. With m == 0 that position is also where the row's
keys are all computed again on the long table (transformers' re-run); with m > 0 transformers'
re-run is on the short table (seq_len O + 1 - m), the same keys, so nothing is recomputed. A
prompt whose own seq_len (W - m) passes O is on the long table from the prefill on.
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
)


def tables(model):
    """(the model on the short table only, the model on the long table only)."""
    cfg = model.config
    short, long = cfg.rope_short_factors, cfg.rope_long_factors
    return model.clone(config=cfg.replace(rope_long_factors=short)), model.clone(
        config=cfg.replace(rope_short_factors=long)
    )


def plan(config, pads: np.ndarray, width: int, max_length: int):
    """How a longrope LM generates from left-padded prompts (pads (B,), width W) up to
    max_length tokens: ("plain", None, False) when no call's seq_len passes O (the model as
    it is); ("long", None, False) when the prompt's does; else ("switch", long_from (B,),
    recompute) (module docstring)."""
    if config.rope_scaling != "longrope":
        return "plain", None, False
    original, least = config.rope_original_max_len, int(pads.min())
    if width - least > original:
        return "long", None, False
    if max_length - 1 - least <= original:  # the last token fed sits at column max_length - 2
        return "plain", None, False
    long_from = (original + least - pads).astype(np.int32)
    return "switch", long_from, least == 0


@struct.dataclass
class SwitchState:
    """The cached stepper's state, every token so far (to run a row again) and each row's
    first position on the long table."""

    inner: CachedState
    buffer: jax.Array  # (R, cache_len) the tokens fed so far, zeros after them
    long_from: jax.Array  # (R,)

    def for_beams(self, beams: int) -> SwitchState:
        tile = lambda x: jnp.repeat(x, beams, axis=0)  # noqa: E731
        return SwitchState(self.inner.for_beams(beams), tile(self.buffer), tile(self.long_from))

    def reordered(self, beam_index: jax.Array) -> SwitchState:
        """Beams follow their parents (long_from is the same for the beams of a row)."""
        batch, beams = beam_index.shape
        rows = self.buffer.reshape(batch, beams, -1)
        buffer = gather_beams(rows, beam_index).reshape(self.buffer.shape)
        return self.replace(inner=self.inner.reordered(beam_index), buffer=buffer)

    def grown(self, length: int) -> SwitchState:
        return self.replace(inner=self.inner.grown(length))


def _rows_where(use, a, b):
    """a's leaves in the rows where `use` (R,), b's elsewhere; scalars (the cache indices,
    equal in both) from a."""

    def pick(x, y):
        if x.ndim == 0:
            return x
        return jnp.where(use.reshape((-1,) + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(pick, a, b)


def switching_stepper(model, variables, cache_len: int, long_from, recompute: bool) -> Stepper:
    """A KV-cached stepper for an LM whose rows go over to longrope's long table at their
    position long_from (R,): fed on the short table below it, on the long one from it; where
    `recompute`, the row's whole sequence is run again on the long table at that position."""
    short_model, long_model = tables(model)
    short = cached_stepper(short_model, variables, None, cache_len)
    long = cached_stepper(long_model, variables, None, cache_len)

    def start(prefix):
        logits, inner = short.start(prefix)  # plan: every prefix position is below long_from
        buffer = jnp.zeros((prefix.shape[0], cache_len), jnp.int32)
        buffer = buffer.at[:, : prefix.shape[1]].set(prefix.astype(jnp.int32))
        return logits, SwitchState(inner, buffer, jnp.asarray(long_from))

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
