"""One token per row and step (greedy, sampling): the engine's `TokenSelector`.

Rules it is built from:
- `choose`: how the token is chosen (`rules.ChooseGreedy()`, `rules.ChooseSample(...)`);
- `processors`: how the logits are processed first (None: not at all; Hugging Face's logits
  processors plug in here), called as `processors(scores (B, V) float32, history)` with the
  row's token history in the output buffer's layout;
- the end rule: a row that chose an EOS (`eos`: one id (), -1 for none, or a (V,) bool mask
  of several) is finished, and every later token is `pad`; a row also ends after `n_new` new
  tokens (`has_eos=False`: no EOS, compiled out).

Output: a buffer (B, W) written in place: the token chosen at position `pos` goes to column
`pos + offset` of its row (the project: the new tokens only, offset = -prompt length; Hugging
Face: transformers' layout, offset = the row's left padding). Forced prompt tokens are fed, not
written; nothing is written to a done row. `result` is (buffer, steps (B,): new tokens written,
pad fill after EOS included).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from flax_transformer.decoding.engine import Choice
from flax_transformer.decoding.inputs import Prompts
from flax_transformer.decoding.rules import ChooseGreedy, ChooseSample
from flax_transformer.decoding.strategies import Greedy, Sample


@struct.dataclass
class History:
    """What a logits processor may read about each row: its tokens so far."""

    seq: jax.Array  # (R, W) the output buffer's layout
    cur_len: jax.Array  # (R,) the column the next token goes to = the row's length so far
    offset: jax.Array  # (R,) the buffer column of position 0 (left padding before it)


@struct.dataclass
class TokenCarry:
    """The TokenSelector's loop carry: the output buffer and each row's progress."""

    buffer: jax.Array  # (B, W) int32 the output, written in place
    unfinished: jax.Array  # (B,) no EOS yet
    steps: jax.Array  # (B,) new tokens written


@dataclasses.dataclass(frozen=True)
class TokenSelector:
    """The engine's selector for one token per row and step (module docstring); `result`:
    (buffer (B, W), steps (B,))."""

    prompts: Any  # tokens (B, P), lengths (B,), forced(pos), token_at(pos)
    buffer: jax.Array  # (B, W) the output before anything is chosen
    offset: jax.Array  # (B,) buffer column = pos + offset
    choose: Any  # rules.ChooseGreedy() | rules.ChooseSample(...)
    eos: jax.Array  # () int32 the EOS id (-1: none), or (V,) bool: the EOS ids
    pad: jax.Array  # () int32, what a finished row gets
    n_new: int  # new tokens per row at most
    rng: jax.Array | None = None  # sampling: fold_in(rng, pos) draws position pos
    processors: Any = None
    has_eos: bool = True

    beams = 1

    def init(self, batch: int) -> TokenCarry:
        """The buffer as given, every row unfinished, no new tokens written."""
        return TokenCarry(
            buffer=self.buffer,
            unfinished=jnp.ones((batch,), bool),
            steps=jnp.zeros((batch,), jnp.int32),
        )

    def step(self, carry: TokenCarry, done, pos, logits) -> Choice:
        """Choose (or force) the token at position `pos`; logits (B, V)."""
        prompts = self.prompts
        forced = prompts.forced(pos)  # (B,)
        new_index = pos - prompts.lengths  # (B,) index among the new tokens, < 0 while forced
        col = pos + self.offset  # (B,) the buffer column of position pos
        active = ~forced & ~done
        if self.processors is not None:
            history = History(carry.buffer, col, self.offset)
            logits = self.processors(logits.astype(jnp.float32), history)
        key = jax.random.fold_in(self.rng, pos) if self.choose.needs_key else None
        token = self.choose(logits, key)
        unfinished = carry.unfinished
        if self.has_eos:
            token = jnp.where(unfinished, token, self.pad)
        token = jnp.where(forced, prompts.token_at(pos), token)
        hit = (jnp.arange(carry.buffer.shape[1])[None, :] == col[:, None]) & active[:, None]
        buffer = jnp.where(hit, token[:, None], carry.buffer)
        if self.has_eos:
            is_eos = self.eos[token] if self.eos.ndim else token == self.eos
            unfinished &= ~(active & is_eos)
        steps = jnp.where(active, new_index + 1, carry.steps)
        done = done | (active & ((new_index >= self.n_new - 1) | ~unfinished))
        return Choice(TokenCarry(buffer, unfinished, steps), token, done, None)

    def result(self, carry: TokenCarry):
        """(buffer (B, W), steps (B,): new tokens written per row, pad fill included)."""
        return carry.buffer, carry.steps


def token_selector(
    prompts: Prompts, strategy: Greedy | Sample, eos_id, rng, *, max_new_tokens: int,
    pad_id: int,
) -> TokenSelector:  # fmt: skip
    """The project's greedy / sampling search: its output (buffer) is the new tokens only,
    (B, max_new_tokens), pad-filled; eos_id () int32 traced (-1: no EOS, never stops), or a
    (V,) bool table of several EOS ids (inputs.eos_array)."""
    batch = prompts.tokens.shape[0]
    return TokenSelector(
        prompts=prompts,
        buffer=jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
        offset=-prompts.lengths,  # column = index among the new tokens
        choose=chooser(strategy),
        eos=eos_id if jnp.asarray(eos_id).dtype == bool else jnp.asarray(eos_id, jnp.int32),
        pad=pad_id,
        n_new=max_new_tokens,
        rng=rng,
    )


def chooser(strategy: Greedy | Sample) -> ChooseGreedy | ChooseSample:
    """The token rule of a project strategy (its numbers traced or not)."""
    if isinstance(strategy, Sample):
        return ChooseSample(strategy.temperature, strategy.top_k, strategy.top_p)
    return ChooseGreedy()
