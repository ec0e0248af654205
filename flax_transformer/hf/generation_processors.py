"""transformers' logits processors, in JAX, in transformers' order (`_get_logits_processor`).

Each works on float32 scores (R, V) -- transformers casts the logits to float32 before any of
them, whatever the model's dtype -- and sees each row's token history the way transformers'
`input_ids` holds it: `seq` (R, L) in transformers' layout (a decoder-only prompt left-padded,
then the new tokens), `cur_len` (R,) its current length. Rows may be at different lengths
(a ragged decoder-only batch decodes each row at its own pace, see generation.py).

Order and rules, as transformers 5.x applies them:
1. repetition_penalty != 1: every token already in the row (left padding excluded for a
   decoder-only prompt) gets score * penalty if the score is < 0, else score / penalty.
2. no_repeat_ngram_size n: a token that would complete an n-gram already in the row is banned
   (-inf); nothing while the row is shorter than n.
3. bad_words_ids: single tokens always banned; a longer entry bans its last token when the row
   ends with the rest of it. Entries equal to a lone EOS were dropped (generation_options.py).
4. min_length (min_new_tokens folded in): EOS banned while cur_len < min_length.
5. forced_bos_token_id: at cur_len == 1 every other token is -inf, that one 0.
6. forced_eos_token_id: at cur_len == max_length - 1 every other token is -inf, EOS 0.
Sampling only (greedy and beam search never apply them): temperature (if != 1), top_k (if
!= 0; the k-th best score and everything equal to it stays), top_p (if < 1; transformers'
TopPLogitsWarper exactly: a stable ascending sort, tokens whose cumulative probability is
<= 1 - top_p go, the best one always stays; of two equal tokens at the cut one may go). These
are the decoding engine's sampling rule (`sampling_rule`, decoding.rules.ChooseSample with
top_p_ties="transformers"; the project's own `Sample` keeps both of two equal tokens instead).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flax_transformer.decoding.rules import ChooseSample
from flax_transformer.hf.generation_options import Options

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class ProcessorPlan:
    """Which processors run (compile-time); their numbers are in `Knobs` (traced)."""

    repetition: bool
    no_repeat_ngram: int
    bad_single: bool
    bad_multi: tuple[tuple[int, ...], ...]
    min_length: bool
    forced_bos: bool
    forced_eos: bool
    temperature: bool
    top_k: bool
    top_p: bool


@struct.dataclass
class Knobs:
    """The traced numbers of the processors and the search."""

    repetition_penalty: jax.Array  # () float32
    bad_tokens: jax.Array  # (V,) bool, single-token bad words
    eos_tokens: jax.Array  # (V,) bool
    forced_eos_tokens: jax.Array  # (V,) bool
    forced_bos_id: jax.Array  # () int32
    min_length: jax.Array  # () int32
    max_length: jax.Array  # () int32
    temperature: jax.Array  # () float32
    top_k: jax.Array  # () int32
    top_p: jax.Array  # () float32
    top_p_cut: jax.Array  # () float32: 1 - top_p in double, rounded, as transformers compares
    length_penalties: jax.Array  # (N + 2,) float32: n ** length_penalty for n = 0..N+1
    early_stopping: jax.Array  # () bool: early_stopping is True
    optimistic_length: jax.Array  # () bool: "never" with length_penalty > 0 (beam.py)
    pad_id: jax.Array  # () int32, the fill of finished rows


def plan_and_knobs(opts: Options, vocab: int) -> tuple[ProcessorPlan, Knobs]:
    """The checked options split for jit: which processors run (static) and their numbers,
    token masks (V,) and length-penalty table (traced)."""
    sampling = opts.do_sample
    plan = ProcessorPlan(
        repetition=opts.repetition_penalty != 1.0,
        no_repeat_ngram=opts.no_repeat_ngram_size,
        bad_single=any(len(b) == 1 for b in opts.bad_words_ids),
        bad_multi=tuple(b for b in opts.bad_words_ids if len(b) > 1),
        min_length=opts.min_length > 0 and bool(opts.eos_ids),
        forced_bos=opts.forced_bos_id is not None,
        forced_eos=bool(opts.forced_eos_ids),
        temperature=sampling and opts.temperature != 1.0,
        top_k=sampling and opts.top_k != 0,
        top_p=sampling and opts.top_p < 1.0,
    )

    def token_mask(ids) -> np.ndarray:
        mask = np.zeros((vocab,), bool)
        mask[list(ids)] = True
        return mask

    n_new = opts.max_new_tokens
    # transformers divides float32 scores by the Python float n ** length_penalty, which torch
    # rounds to float32 first: the same table here.
    penalties = [float(n) ** opts.length_penalty if n else 1.0 for n in range(n_new + 2)]
    knobs = Knobs(
        repetition_penalty=np.float32(opts.repetition_penalty),
        bad_tokens=token_mask(b[0] for b in opts.bad_words_ids if len(b) == 1),
        eos_tokens=token_mask(opts.eos_ids),
        forced_eos_tokens=token_mask(opts.forced_eos_ids),
        forced_bos_id=np.int32(opts.forced_bos_id or 0),
        min_length=np.int32(opts.min_length),
        max_length=np.int32(opts.max_length),
        temperature=np.float32(opts.temperature),
        top_k=np.int32(min(max(opts.top_k, 1), vocab)),
        top_p=np.float32(opts.top_p),
        top_p_cut=np.float32(1.0 - opts.top_p),
        length_penalties=np.asarray(penalties, np.float32),
        early_stopping=np.bool_(opts.early_stopping is True),
        optimistic_length=np.bool_(opts.early_stopping == "never" and opts.length_penalty > 0),
        pad_id=np.int32(-1 if opts.pad_id is None else opts.pad_id),
    )
    return plan, knobs


def _rows(x: jax.Array) -> jax.Array:  # (R,) -> (R, 1)
    return x[:, None]


def seen_tokens(seq, cur_len, ignore_before, vocab: int) -> jax.Array:
    """(R, V) bool: the token occurs in seq[r, ignore_before[r]:cur_len[r]]."""
    cols = jnp.arange(seq.shape[1])[None, :]
    valid = (cols < _rows(cur_len)) & (cols >= _rows(ignore_before))
    rows = jnp.broadcast_to(jnp.arange(seq.shape[0])[:, None], seq.shape)
    target = jnp.where(valid, seq, vocab)  # vocab: a spare column, dropped
    seen = jnp.zeros((seq.shape[0], vocab + 1), bool).at[rows, target].set(True)
    return seen[:, :vocab]


def ngram_bans(seq, cur_len, n: int, vocab: int) -> jax.Array:
    """(R, V) bool: the tokens that would repeat an n-gram of seq[r, :cur_len[r]]."""
    rows_n, length = seq.shape
    starts = length - n + 1  # window i covers columns i .. i+n-1
    windows = jnp.stack([seq[:, j : starts + j] for j in range(n)], axis=-1)  # (R, starts, n)
    prefix_cols = _rows(cur_len) + 1 - n + jnp.arange(n - 1)[None, :]  # (R, n-1)
    prefix = jnp.take_along_axis(seq, jnp.clip(prefix_cols, 0, length - 1), axis=1)
    matches = jnp.all(windows[:, :, :-1] == prefix[:, None, :], axis=-1)  # (R, starts)
    valid = jnp.arange(starts)[None, :] <= _rows(cur_len) - n  # windows inside the row
    matches &= valid & (_rows(cur_len) >= n)
    target = jnp.where(matches, windows[:, :, -1], vocab)
    rows = jnp.broadcast_to(jnp.arange(rows_n)[:, None], target.shape)
    banned = jnp.zeros((rows_n, vocab + 1), bool).at[rows, target].set(True)
    return banned[:, :vocab]


def multi_token_bans(seq, cur_len, bad_multi, vocab: int) -> jax.Array:
    """(R, V) bool: last tokens of bad word sequences whose prefix ends the row."""
    banned = jnp.zeros((seq.shape[0], vocab), bool)
    length = seq.shape[1]
    for words in bad_multi:
        prefix = jnp.asarray(words[:-1], jnp.int32)
        cols = _rows(cur_len) - len(prefix) + jnp.arange(len(prefix))[None, :]
        tail = jnp.take_along_axis(seq, jnp.clip(cols, 0, length - 1), axis=1)
        match = jnp.all(tail == prefix[None, :], axis=1) & (cur_len >= len(prefix))
        banned = banned.at[:, words[-1]].max(match)
    return banned


def process(plan: ProcessorPlan, knobs: Knobs, scores, seq, cur_len, ignore_before):
    """transformers' processors (no sampling warpers) on float32 scores (R, V)."""
    vocab = scores.shape[-1]
    if plan.repetition:
        penalty = knobs.repetition_penalty
        penalized = jnp.where(scores < 0, scores * penalty, scores / penalty)
        scores = jnp.where(seen_tokens(seq, cur_len, ignore_before, vocab), penalized, scores)
    if plan.no_repeat_ngram:
        scores = jnp.where(ngram_bans(seq, cur_len, plan.no_repeat_ngram, vocab), NEG_INF, scores)
    if plan.bad_single:
        scores = jnp.where(knobs.bad_tokens[None, :], NEG_INF, scores)
    if plan.bad_multi:
        scores = jnp.where(multi_token_bans(seq, cur_len, plan.bad_multi, vocab), NEG_INF, scores)
    if plan.min_length:
        early = _rows(cur_len < knobs.min_length)
        scores = jnp.where(early & knobs.eos_tokens[None, :], NEG_INF, scores)
    if plan.forced_bos:
        only_bos = jnp.where(jnp.arange(vocab) == knobs.forced_bos_id, 0.0, NEG_INF)
        scores = jnp.where(_rows(cur_len == 1), only_bos[None, :], scores)
    if plan.forced_eos:
        only_eos = jnp.where(knobs.forced_eos_tokens, 0.0, NEG_INF)
        scores = jnp.where(_rows(cur_len == knobs.max_length - 1), only_eos[None, :], scores)
    return scores.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class HFProcessors:
    """The processors as one rule of the decoding engine: `rule(scores (R, V), history)`, the
    history (decoding.token_search.History) in transformers' layout (offset = left padding)."""

    plan: ProcessorPlan
    knobs: Knobs

    def __call__(self, scores, history):
        return process(self.plan, self.knobs, scores, history.seq, history.cur_len, history.offset)


def sampling_rule(plan: ProcessorPlan, knobs: Knobs):
    """transformers' sampling warpers (temperature, top-k, top-p) as the engine's one sampling
    rule (decoding.rules.ChooseSample) with transformers' top-p tie rule; the filters the plan
    leaves off are not compiled."""
    return ChooseSample(
        temperature=knobs.temperature,  # dividing by 1 (plan.temperature off) is exact
        top_k=knobs.top_k,
        top_p=knobs.top_p,
        use_top_k=plan.top_k,
        use_top_p=plan.top_p,
        top_p_ties="transformers",
        top_p_cut=knobs.top_p_cut,
    )


def warp(plan: ProcessorPlan, knobs: Knobs, scores):
    """Deprecated: the sampling warpers are `sampling_rule(plan, knobs)` (the engine's
    decoding.rules.ChooseSample); this returns its filtered float32 scores."""
    warnings.warn(
        "flax_transformer.hf.generation_processors.warp is deprecated: use "
        "flax_transformer.hf.generation_processors.sampling_rule (decoding.rules.ChooseSample)",
        DeprecationWarning,
        stacklevel=2,
    )
    rule = sampling_rule(plan, knobs)
    scores = scores.astype(jnp.float32) / rule.temperature
    return rule.filtered(scores)
