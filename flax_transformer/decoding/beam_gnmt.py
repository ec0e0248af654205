"""This project's beam search, with GNMT's length penalty: the engine's `GNMTBeam` selector.

Each step ranks the 2K best continuations of the K live beams. A continuation ending in EOS
joins the finished pool only if it ranks among the first K (so beam 1 is greedy); the K best
others stay live. An example is done when its K finished hypotheses all score above the best
score a live beam could still reach; the loop stops when every example is done or has produced
max_new_tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from flax_transformer.decoding.cache import gather_beams
from flax_transformer.decoding.engine import Choice
from flax_transformer.decoding.inputs import Prompts
from flax_transformer.decoding.strategies import Beam
from flax_transformer.decoding.top_k import top_k

NEG_INF = -jnp.inf


def length_penalty(length: jax.Array, alpha: float | jax.Array) -> jax.Array:
    """GNMT's ((5 + length) / 6) ** alpha; scores are log-probabilities divided by it."""
    return ((5.0 + jnp.asarray(length).astype(jnp.float32)) / 6.0) ** alpha


@struct.dataclass
class Hypotheses:
    """Per example, K live beams and the K best finished hypotheses (sequences of new tokens)."""

    live_seqs: jax.Array  # (B, K, N) int32
    live_logp: jax.Array  # (B, K) log-probability so far, -inf for an unused beam
    fin_seqs: jax.Array  # (B, K, N) int32
    fin_scores: jax.Array  # (B, K) length-normalised, best first; -inf while empty
    fin_flags: jax.Array  # (B, K) the slot holds a finished hypothesis


@dataclasses.dataclass(frozen=True)
class GNMTBeam:
    """The engine's selector for this project's beam search (module docstring): K = strategy.size
    hypotheses per row. `result`: tokens (B, K, max_new_tokens) and scores (B, K), best first."""

    prompts: Prompts
    strategy: Beam
    eos_id: jax.Array  # () int32, -1: none; or (V,) bool: several EOS ids (inputs.eos_array)
    max_new_tokens: int
    pad_id: int

    @property
    def beams(self) -> int:
        """K, the beams per row: the strategy's size."""
        return self.strategy.size

    def init(self, batch: int) -> Hypotheses:
        """No finished hypotheses, pad-filled sequences (B, K, max_new_tokens); only beam 0
        live (the K beams start identical)."""
        beams, n_new = self.beams, self.max_new_tokens
        empty = jnp.full((batch, beams, n_new), self.pad_id, jnp.int32)
        first_live = jnp.where(jnp.arange(beams) == 0, 0.0, NEG_INF)  # identical beams: keep one
        return Hypotheses(
            live_seqs=empty,
            live_logp=jnp.broadcast_to(first_live, (batch, beams)),
            fin_seqs=empty,
            fin_scores=jnp.full((batch, beams), NEG_INF),
            fin_flags=jnp.zeros((batch, beams), bool),
        )

    def step(self, hyps: Hypotheses, done, pos, logits) -> Choice:
        """Extend the beams with the token at position `pos`; logits (B*K, V). Rows already
        done keep their hypotheses."""
        prompts, eos_id = self.prompts, self.eos_id
        batch, beams, n_new = done.shape[0], self.beams, self.max_new_tokens
        alpha = self.strategy.alpha
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, beams, vocab)
        forced = prompts.forced(pos)  # (B,)
        forced_only = jnp.where(
            jnp.arange(vocab) == prompts.token_at(pos)[:, None, None], 0.0, NEG_INF
        )
        logp = jnp.where(forced[:, None, None], forced_only, logp)
        candidates = hyps.live_logp[:, :, None] + logp  # (B, K, V)
        top_logp, top_index = top_k(candidates, 2 * beams)  # (B, 2K), flat over K x V
        parent, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        new_index = pos - prompts.lengths  # (B,)
        writes = jnp.arange(n_new)[None, None, :] == new_index[:, None, None]
        top_seqs = jnp.where(writes, token[:, :, None], gather_beams(hyps.live_seqs, parent))
        is_eos = eos_id[token] if eos_id.ndim else token == eos_id
        is_eos = is_eos & ~forced[:, None]  # (B, 2K)
        active = (new_index >= 0) & (new_index < n_new)  # (B,) not forced, not past the end

        # Finished pool: EOS continuations ranked among the first K, length-normalised.
        accept = is_eos & (jnp.arange(2 * beams) < beams)[None] & active[:, None]
        new_scores = top_logp / length_penalty(new_index + 1, alpha)[:, None]
        pool_scores = jnp.concatenate([hyps.fin_scores, jnp.where(accept, new_scores, NEG_INF)], 1)
        pool_seqs = jnp.concatenate([hyps.fin_seqs, top_seqs], axis=1)  # (B, 3K, N)
        pool_flags = jnp.concatenate([hyps.fin_flags, accept], axis=1)
        fin_scores, keep = jax.lax.top_k(pool_scores, beams)
        fin_seqs, fin_flags = gather_beams(pool_seqs, keep), gather_beams(pool_flags, keep)

        # Live beams: the K best continuations that did not end.
        live_logp, keep = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_logp), beams)
        new = Hypotheses(gather_beams(top_seqs, keep), live_logp, fin_seqs, fin_scores, fin_flags)
        best_possible_penalty = length_penalty(n_new, alpha)  # alpha >= 0: the largest
        row_done = (new_index >= n_new - 1) | jnp.all(
            fin_flags & (fin_scores > live_logp[:, :1] / best_possible_penalty), axis=1
        )

        def freeze(old, new):  # rows past their last token keep their results
            return jnp.where(done.reshape((batch,) + (1,) * (new.ndim - 1)), old, new)

        return Choice(
            carry=jax.tree.map(freeze, hyps, new),
            token=gather_beams(token, keep),
            done=done | row_done,
            parents=gather_beams(parent, keep),
        )

    def result(self, hyps: Hypotheses) -> tuple[jax.Array, jax.Array]:
        """Rows without K finished hypotheses also rank their live beams (at full length)."""
        beams = self.beams
        live_scores = hyps.live_logp / length_penalty(self.max_new_tokens, self.strategy.alpha)
        live_scores = jnp.where(
            jnp.all(hyps.fin_flags, axis=1, keepdims=True), NEG_INF, live_scores
        )
        scores, keep = jax.lax.top_k(jnp.concatenate([hyps.fin_scores, live_scores], axis=1), beams)
        seqs = jnp.concatenate([hyps.fin_seqs, hyps.live_seqs], axis=1)
        return gather_beams(seqs, keep), scores
