"""Greedy search and sampling with transformers' rules (`GenerationMixin._sample`), one
lax.while_loop over a KV-cached stepper (flax_transformer.decoding.cache).

transformers' rules followed here:
- The next token is the argmax (first index among equal maxima, as torch.argmax) of the
  processed float32 scores, or a draw from their softmax when sampling.
- A row that has produced an EOS is finished: every later token is pad_token_id. A row stops at
  max_length. The whole batch stops when every row is finished or at max_length, so the output
  is as wide as the longest row needs; shorter rows are pad-filled to that width.
- Without any EOS id, rows never finish early and nothing is pad-filled.

Ragged decoder-only prompts: transformers left-pads them and derives each token's position from
the attention mask (padding hidden). Here each row is decoded at its own pace instead: the
real prompt tokens sit at positions 0.. (right-padded for the model), the common prefix is
prefilled in one call and a longer prompt's remaining tokens are fed (forced) one per step.
Each row sees exactly the tokens and positions it sees in transformers; the output is written
back in transformers' left-padded layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from flax_transformer.hf.generation_processors import Knobs, ProcessorPlan, process, warp


@struct.dataclass
class Rows:
    """The prompts as this loop sees them (all (B, ...) int32)."""

    tokens: jax.Array  # (B, P) real prompt tokens first (right-padded): the model's input
    lengths: jax.Array  # (B,) real prompt tokens per row
    pads: jax.Array  # (B,) left padding in transformers' layout (P - lengths)
    seq: jax.Array  # (B, max_length) transformers' layout: prompt as given, then fill

    def forced(self, pos):
        return pos < self.lengths

    def token_at(self, pos):  # (B,) the prompt token at position pos (clamped)
        pos = jnp.minimum(pos, self.tokens.shape[1] - 1)
        return jax.lax.dynamic_index_in_dim(self.tokens, pos, axis=1, keepdims=False)


@struct.dataclass
class GreedyLoop:
    pos: jax.Array  # () the position whose token is chosen next
    state: Any  # the stepper's state
    token: jax.Array  # (B,) the token just chosen or forced, fed next
    seq: jax.Array  # (B, max_length) transformers' layout
    unfinished: jax.Array  # (B,) no EOS yet
    steps: jax.Array  # (B,) new tokens written (pad fill after EOS included)
    done: jax.Array  # (B,) the row's output can no longer change


def write_column(seq, col, token, where):
    """seq (R, L) with token (R,) written at column col (R,) in the rows where `where`."""
    hit = (jnp.arange(seq.shape[1])[None, :] == col[:, None]) & where[:, None]
    return jnp.where(hit, token[:, None], seq)


def greedy_search(
    stepper, rows: Rows, plan: ProcessorPlan, knobs: Knobs, rng, *, n_new: int, prefix_len: int,
    sample: bool, has_eos: bool,
):  # fmt: skip
    """(seq (B, max_length), steps (B,)): transformers' output is seq[:, :P + max(steps)]."""
    batch = rows.tokens.shape[0]

    def choose(loop: GreedyLoop, logits) -> GreedyLoop:
        pos = loop.pos
        forced = rows.forced(pos)
        new_index = pos - rows.lengths  # (B,) index among the new tokens
        col = pos + rows.pads  # (B,) transformers' column = its input length right now
        active = ~forced & ~loop.done
        scores = process(plan, knobs, logits.astype(jnp.float32), loop.seq, col, rows.pads)
        if sample:
            scores = warp(plan, knobs, scores)
            key = jax.random.fold_in(rng, pos)
            token = jax.random.categorical(key, scores, axis=-1).astype(jnp.int32)
        else:
            token = first_argmax(scores)
        if has_eos:
            token = jnp.where(loop.unfinished, token, knobs.pad_id)
        token = jnp.where(forced, rows.token_at(pos), token)
        seq = write_column(loop.seq, col, token, active)
        unfinished = loop.unfinished
        if has_eos:
            unfinished &= ~(active & knobs.eos_tokens[token])
        steps = jnp.where(active, new_index + 1, loop.steps)
        done = loop.done | (active & ((new_index >= n_new - 1) | ~unfinished))
        return loop.replace(token=token, seq=seq, unfinished=unfinished, steps=steps, done=done)

    logits, state = stepper.start(rows.tokens[:, :prefix_len])
    nothing = jnp.zeros((batch,), bool)
    first = GreedyLoop(
        pos=jnp.array(prefix_len, jnp.int32),
        state=state,
        token=jnp.zeros((batch,), jnp.int32),
        seq=rows.seq,
        unfinished=~nothing,
        steps=jnp.zeros((batch,), jnp.int32),
        done=nothing,
    )
    first = choose(first, logits)

    def body(loop: GreedyLoop) -> GreedyLoop:
        logits, state = stepper.feed(loop.state, loop.token, loop.pos)
        return choose(loop.replace(pos=loop.pos + 1, state=state), logits)

    last = jax.lax.while_loop(lambda loop: ~jnp.all(loop.done), body, first)
    return last.seq, last.steps


def first_argmax(scores):
    """argmax over the last axis, the first index among equal maxima (torch.argmax's choice).

    Written as max + min-index: two plain reductions, which XLA on CPU runs much faster than
    its variadic argmax reduction."""
    best = jnp.max(scores, axis=-1, keepdims=True)
    index = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(scores == best, index, scores.shape[-1]), axis=-1).astype(jnp.int32)
