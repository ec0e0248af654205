"""Beam search with transformers' own rules (5.x `GenerationMixin._beam_search` and its
helpers): the engine's `HFBeam` selector (flax_transformer.decoding.engine), K = num_beams beams
per row, the logits processors plugged in (`HFProcessors`).

transformers' rules, followed step for step (t = index of the new token, 0-based; "length" of
a hypothesis = its new tokens, EOS included: cur_len + 1 - decoder_prompt_len, the same count
for encoder-decoder (decoder start excluded) and decoder-only models (prompt excluded)):
- Scores are float32: log_softmax of the float32 logits, then the logits processors, plus the
  beam's running score. Initially beam 0 has score 0 and the others -1e9, so the first step
  expands beam 0 only.
- Candidates: the top (1 + number of EOS ids, at least 2) * K of the K * V continuations
  (torch.topk; ties go to the lower flat index here, beam-major then token).
- A candidate "hits the stopping criteria" if its token is an EOS or the sequence reaches
  max_length. Running beams for the next step: the K best candidates after adding -1e9 to
  those that hit it.
- Finished pool (K per row): a candidate joins only if it hit the stopping criteria AND ranks
  among the first K candidates. Its score is its log-probability / length ** length_penalty
  (torch divides by the float32 rounding of that Python float). Candidates that did not
  qualify get -1e9 added, as do all candidates of a row whose pool is full with
  early_stopping=True, or whose early-stop heuristic said no improvement is possible; then the
  pool keeps the K best of (old pool, candidates), best first.
- Early-stop heuristic (after the step): improvement is still possible while some pool slot is
  unfilled, or while the best running score / L ** length_penalty beats the worst finished
  score, with L = the current length, or the maximal length (max_length - prompt length) when
  early_stopping="never" and length_penalty > 0. Once impossible it stays impossible.
- The loop ends when no row can improve, or (early_stopping=True) every pool is full, or every
  candidate hit the stopping criteria (max_length). A row whose pool can no longer change is
  frozen here (done); transformers keeps computing it but discards the result, so the output
  is the same.
- Output: the first num_return_sequences of each pool (best first), cut to the prompt length +
  the longest returned hypothesis; positions after a hypothesis's end hold pad_token_id (or
  the first EOS id when pad is 0 or unset; -1 without EOS: transformers'
  `pad_token_id or eos_token_id[0]`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from flax_transformer.decoding.cache import gather_beams
from flax_transformer.decoding.engine import Choice
from flax_transformer.decoding.token_search import History
from flax_transformer.decoding.top_k import top_k
from flax_transformer.hf.generation_processors import HFProcessors
from flax_transformer.hf.generation_rows import Rows, write_column

BIG = 1.0e9  # transformers' "very large negative" score offset (float32 arithmetic)


@struct.dataclass
class BeamCarry:
    """HFBeam's loop carry: the K running beams and the finished pool of each row."""

    run_seq: jax.Array  # (B, K, L) running beams, transformers' layout
    run_scores: jax.Array  # (B, K) float32
    fin_seq: jax.Array  # (B, K, L) the finished pool, best first
    fin_scores: jax.Array  # (B, K) float32
    fin_flags: jax.Array  # (B, K) bool, the slot holds a finished hypothesis
    fin_len: jax.Array  # (B, K) int32, new tokens of the hypothesis
    can_improve: jax.Array  # (B,) the early-stop heuristic still says "may improve"


@dataclasses.dataclass(frozen=True)
class HFBeam:
    """`result`: (pool seq (B, K, max_length), pool lengths (B, K)), best first."""

    rows: Rows
    processors: HFProcessors
    beams: int
    n_eos: int
    n_new: int

    def init(self, batch: int) -> BeamCarry:
        """Every beam the row's prompt (B, K, max_length); beam 0 scores 0, the others -1e9;
        an empty pool."""
        beams, length = self.beams, self.rows.seq.shape[1]
        seq = jnp.broadcast_to(self.rows.seq[:, None, :], (batch, beams, length))
        first_scores = jnp.where(jnp.arange(beams) == 0, 0.0, -BIG).astype(jnp.float32)
        return BeamCarry(
            run_seq=seq,
            run_scores=jnp.broadcast_to(first_scores, (batch, beams)),
            fin_seq=seq,
            fin_scores=jnp.full((batch, beams), -BIG, jnp.float32),
            fin_flags=jnp.zeros((batch, beams), bool),
            fin_len=jnp.zeros((batch, beams), jnp.int32),
            can_improve=jnp.ones((batch,), bool),
        )

    def step(self, loop: BeamCarry, done, pos, logits) -> Choice:
        """Choose the tokens at `pos`; logits (B*K, V)."""
        rows, knobs, beams, n_new = self.rows, self.processors.knobs, self.beams, self.n_new
        batch, length = rows.seq.shape
        keep = max(2, 1 + self.n_eos) * beams
        tile = lambda x: jnp.repeat(x, beams, axis=0)  # noqa: E731  (B, ...) -> (B*K, ...)
        big = jnp.float32(BIG)
        forced = rows.forced(pos)  # (B,)
        active = ~forced & ~done
        new_index = pos - rows.lengths  # (B,)
        col = pos + rows.pads  # (B,) transformers' cur_len
        vocab = logits.shape[-1]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        flat_seq = loop.run_seq.reshape(batch * beams, length)
        logp = self.processors(logp, History(flat_seq, tile(col), tile(rows.pads)))
        cand = logp.reshape(batch, beams, vocab) + loop.run_scores[:, :, None]
        top_scores, top_index = top_k(cand, keep)  # (B, 2K), flat over the K x V candidates
        parent, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        top_seq = gather_beams(loop.run_seq, parent)  # (B, 2K, L)
        top_seq = write_column(
            top_seq.reshape(-1, length), jnp.repeat(col, keep), token.reshape(-1),
            jnp.ones((batch * keep,), bool),
        ).reshape(batch, keep, length)  # fmt: skip
        hits = knobs.eos_tokens[token] | (col + 1 >= knobs.max_length)[:, None]

        # Running beams: the K best candidates that did not stop.
        run_cand = top_scores + hits.astype(jnp.float32) * -big
        _, best = jax.lax.top_k(run_cand, beams)
        run_seq, run_scores = gather_beams(top_seq, best), gather_beams(run_cand, best)
        run_parent, run_token = gather_beams(parent, best), gather_beams(token, best)

        # Finished pool: stopped candidates among the first K, length-normalised.
        just = hits & (jnp.arange(keep) < beams)[None, :]
        scores = top_scores / knobs.length_penalties[new_index + 1][:, None]
        full = jnp.all(loop.fin_flags, axis=1, keepdims=True) & knobs.early_stopping
        scores = scores + full.astype(jnp.float32) * -big
        scores = scores + (~loop.can_improve[:, None]).astype(jnp.float32) * -big
        scores = scores + (~just).astype(jnp.float32) * -big
        merged_scores = jnp.concatenate([loop.fin_scores, scores], axis=1)
        _, best = jax.lax.top_k(merged_scores, beams)
        fin_scores = gather_beams(merged_scores, best)
        fin_seq = gather_beams(jnp.concatenate([loop.fin_seq, top_seq], axis=1), best)
        fin_flags = gather_beams(jnp.concatenate([loop.fin_flags, just], axis=1), best)
        new_len = jnp.broadcast_to((new_index + 1)[:, None], just.shape)
        fin_len = gather_beams(jnp.concatenate([loop.fin_len, new_len], axis=1), best)

        # The early-stop heuristic for the next step.
        hypothetical = jnp.where(knobs.optimistic_length, n_new, new_index + 1)
        best_running = run_scores[:, 0] / knobs.length_penalties[hypothetical]
        worst = jnp.where(fin_flags, jnp.min(fin_scores, axis=1, keepdims=True), -big)
        can_improve = loop.can_improve & jnp.any(best_running[:, None] > worst, axis=1)
        pool_closed = ~can_improve | (jnp.all(fin_flags, axis=1) & knobs.early_stopping)
        row_done = (new_index >= n_new - 1) | pool_closed  # every candidate hit max_length

        def pick(new, old):  # rows that did not choose keep their old values
            where = active.reshape((batch,) + (1,) * (new.ndim - 1))
            return jnp.where(where, new, old)

        forced_token = jnp.broadcast_to(rows.token_at(pos)[:, None], (batch, beams))
        new = loop.replace(
            run_seq=pick(run_seq, loop.run_seq),
            run_scores=pick(run_scores, loop.run_scores),
            fin_seq=pick(fin_seq, loop.fin_seq),
            fin_scores=pick(fin_scores, loop.fin_scores),
            fin_flags=pick(fin_flags, loop.fin_flags),
            fin_len=pick(fin_len, loop.fin_len),
            can_improve=pick(can_improve, loop.can_improve),
        )
        beam_index = pick(run_parent, jnp.broadcast_to(jnp.arange(beams), (batch, beams)))
        return Choice(
            carry=new,
            token=jnp.where(forced[:, None], forced_token, run_token),
            done=done | (active & row_done),
            parents=beam_index,
        )

    def result(self, loop: BeamCarry):
        """The pool: seq (B, K, max_length) and new-token lengths (B, K), best first."""
        return loop.fin_seq, loop.fin_len
