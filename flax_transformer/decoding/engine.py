"""The decoding engine: the package's one `lax.while_loop` search, for every model and rule.

    out = run_search(stepper, prompts, selector, prefix_len=m)

Three parts plug in:
- a *stepper* (`decoding.cache`): `start(prefix (B, m))` -> logits after the prefix (B, V) and
  the model's state; `feed(state, token (R,), pos)` -> the logits after `token` (R, V). Any
  model family that has a stepper decodes here (the KV-cached one, or the recomputing one).
- the *prompts*: anything with `tokens` (B, P), `forced(pos)` and `token_at(pos)`
  (`decoding.inputs.Prompts`, `hf.generation_rows.Rows`); the first `prefix_len` tokens are
  prefilled in one call, a longer prompt's later tokens are forced one per step by the selector.
- a *selector*: the search shape and its rules, which owns its part of the loop carry:
  `beams` (hypotheses fed per row: 1 for one token per row, K for beam search), `init(batch)`
  -> its carry, `step(carry, done (B,), pos, logits (B*beams, V))` -> `Choice`, and
  `result(carry)` -> the search's output. `decoding.token_search.TokenSelector` (greedy /
  sampling, with logits processors and an end rule), `decoding.beam_gnmt.GNMTBeam` and
  `hf.beam_selector.HFBeam` are the selectors of the package.

The loop: prefill, choose at position prefix_len; then make the model state follow the chosen
beams' parents, feed the chosen token of position pos and choose at pos + 1, until every row is
done (the selector says when a row is done: EOS, length, or its hypotheses can no longer
change). The loop runs once per cache length of the stepper (`stepper.lengths`), the state
grown between them, so early steps read and move a short cache.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Choice:
    """What a selector decided at one position."""

    carry: Any  # the selector's own carry
    token: jax.Array  # (B,) or (B, K): fed to the model next
    done: jax.Array  # (B,) the row's output can no longer change
    parents: jax.Array | None  # (B, K) each beam's parent within its row; None: no reorder


class Selector(Protocol):
    """What `run_search` needs of a search shape and its rules (module docstring)."""

    beams: int  # hypotheses the model runs per row (1: one token per row)

    def init(self, batch: int) -> Any:
        """The selector's carry before the first choice, for `batch` rows."""
        ...

    def step(self, carry: Any, done: jax.Array, pos: jax.Array, logits: jax.Array) -> Choice:
        """Choose the tokens at position pos () from logits (B*beams, V); done (B,) rows
        already finished."""
        ...

    def result(self, carry: Any) -> Any:
        """The search's output, read from the final carry."""
        ...


@struct.dataclass
class SearchState:
    """The while_loop carry of every search."""

    pos: jax.Array  # () position of the token chosen last (prompt included)
    model: Any  # the stepper's state, (B * beams, ...) leaves in beam order
    token: jax.Array  # (B,) or (B, K) the tokens chosen or forced at `pos`, fed next
    rule: Any  # the selector's carry
    done: jax.Array  # (B,)
    parents: jax.Array | None  # (B, K) the parents `model` is still to follow; None: no beams


def _after(pos, model_state, choice: Choice) -> SearchState:
    return SearchState(pos, model_state, choice.token, choice.carry, choice.done, choice.parents)


def _followed(state: SearchState):
    """The model state with every beam following its parent. Done at the start of the next
    step, not at the end of the one that chose: there the reorder is the cache's first use,
    so the CPU's in-place reorder writes into the loop's own buffer (kernels.beam_reorder)."""
    return state.model if state.parents is None else state.model.reordered(state.parents)


def run_search(stepper, prompts, selector: Selector, *, prefix_len: int):
    """The search's output (`selector.result`); prefix_len prompt tokens are prefilled at once."""
    batch = prompts.tokens.shape[0]
    logits, model_state = stepper.start(prompts.tokens[:, :prefix_len])  # (B, V)
    if selector.beams > 1:  # (B * K, ...) beams of a row are adjacent
        logits = jnp.repeat(logits, selector.beams, axis=0)
        model_state = model_state.for_beams(selector.beams)
    pos = jnp.array(prefix_len, jnp.int32)
    not_done = jnp.zeros((batch,), bool)
    choice = selector.step(selector.init(batch), not_done, pos, logits)
    first = _after(pos, model_state, choice)

    def body(state: SearchState) -> SearchState:
        logits, model_state = stepper.feed(_followed(state), state.token.reshape(-1), state.pos)
        pos = state.pos + 1
        return _after(pos, model_state, selector.step(state.rule, state.done, pos, logits))

    # One loop per cache length (decoding.cache: the cache grows), each feeding positions
    # below its length; rows done early skip the longer ones.
    state = first
    for i, length in enumerate(stepper.lengths(prefix_len)):
        if i:  # room for the positions below this length
            state = state.replace(model=stepper.grow(state.model, length))
        state = jax.lax.while_loop(lambda s, n=length: ~jnp.all(s.done) & (s.pos < n), body, state)
    return selector.result(state.rule)
