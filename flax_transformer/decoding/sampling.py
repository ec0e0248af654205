"""One token per example and step: the greedy / sampling loop, in a lax.while_loop.

Outputs are the `max_new_tokens` tokens after each prompt, int32 (B, max_new_tokens): the first
EOS is kept, everything after it is pad. The loop stops when every example has emitted EOS or
max_new_tokens tokens.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from flax_transformer.decoding.cache import Stepper
from flax_transformer.decoding.inputs import Prompts
from flax_transformer.decoding.strategies import Greedy, Sample

NEG_INF = -jnp.inf


def choose(strategy: Greedy | Sample, logits: jax.Array, key: jax.Array) -> jax.Array:
    """Next token (B,) from logits (B, V): argmax, or a sample after temperature/top-k/top-p.

    The sampling numbers are traced, so one compiled loop serves every value of them."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if isinstance(strategy, Greedy):
        return greedy
    temperature, top_k, top_p = strategy.temperature, strategy.top_k, strategy.top_p
    logits = logits.astype(jnp.float32) / jnp.where(temperature > 0, temperature, 1.0)
    ranked = jnp.sort(logits, axis=-1)[:, ::-1]  # (B, V) best first
    # top-k: drop what is below the k-th best logit (ties with it stay).
    kth_best = jnp.take(ranked, jnp.clip(top_k, 1, ranked.shape[1]) - 1, axis=1)[:, None]
    cut = jnp.where(top_k > 0, kth_best, NEG_INF)  # (B, 1)
    ranked = jnp.where(ranked < cut, NEG_INF, ranked)
    # top-p: keep the smallest set of most likely tokens whose probability reaches top_p.
    probs = jax.nn.softmax(ranked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.where(mass_before < top_p, ranked, jnp.inf)
    least_likely_kept = jnp.min(kept, axis=-1, keepdims=True)
    cut = jnp.where(top_p < 1.0, jnp.maximum(cut, least_likely_kept), cut)
    logits = jnp.where(logits < cut, NEG_INF, logits)
    sampled = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    return jnp.where(temperature > 0, sampled, greedy)


@struct.dataclass
class TokenLoop:
    """The while_loop carry of greedy / sampling decoding."""

    pos: jax.Array  # () position of `token` in the sequence (prompt included)
    state: Any  # the stepper's state: the cache, or the token buffer
    token: jax.Array  # (B,) the token just chosen or forced, fed next
    out: jax.Array  # (B, N) the new tokens so far, pad elsewhere
    finished: jax.Array  # (B,) EOS emitted
    done: jax.Array  # (B,) finished or the last new token written


def greedy_or_sample(
    stepper: Stepper,
    prompts: Prompts,
    strategy: Greedy | Sample,
    eos_id: jax.Array,
    rng: jax.Array | None,
    *,
    prefix_len: int,
    max_new_tokens: int,
    pad_id: int,
) -> jax.Array:
    """New tokens (B, max_new_tokens); prefix_len tokens of every prompt are prefilled at once."""
    batch, n_new = prompts.tokens.shape[0], max_new_tokens
    slots = jnp.arange(n_new)[None, :]

    def record(pos, logits, loop: TokenLoop) -> TokenLoop:
        """Choose (or force) the token at position `pos`; write it to the output."""
        forced = prompts.forced(pos)  # (B,)
        key = None if rng is None else jax.random.fold_in(rng, pos)
        chosen = jnp.where(loop.finished, pad_id, choose(strategy, logits, key))
        token = jnp.where(forced, prompts.token_at(pos), chosen)
        new_index = pos - prompts.lengths  # (B,) index among the new tokens, < 0 while forced
        out = jnp.where(slots == new_index[:, None], token[:, None], loop.out)
        finished = loop.finished | (~forced & (token == eos_id))
        done = finished | (new_index >= n_new - 1)
        return loop.replace(pos=pos, token=token, out=out, finished=finished, done=done)

    logits, state = stepper.start(prompts.tokens[:, :prefix_len])
    nothing = jnp.zeros((batch,), bool)
    first = TokenLoop(
        pos=jnp.array(prefix_len, jnp.int32),
        state=state,
        token=jnp.zeros((batch,), jnp.int32),
        out=jnp.full((batch, n_new), pad_id, jnp.int32),
        finished=nothing,
        done=nothing,
    )
    first = record(first.pos, logits, first)

    def body(loop: TokenLoop) -> TokenLoop:
        logits, state = stepper.feed(loop.state, loop.token, loop.pos)
        return record(loop.pos + 1, logits, loop.replace(state=state))

    return jax.lax.while_loop(lambda loop: ~jnp.all(loop.done), body, first).out
