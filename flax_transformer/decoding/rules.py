"""How the next token is chosen from one row's logits: the engine's token rules.

- `first_argmax`: greedy, the first index among equal maxima (torch.argmax's choice, and
  jnp.argmax's), for the project's search and Hugging Face's alike.
- `ChooseGreedy()` / `ChooseSample(temperature, top_k, top_p)`: rule objects,
  `rule(logits (R, V), key) -> tokens (R,)`.

One sampling rule for both paths (before the engine the two disagreed on the details):
- temperature: logits / temperature in float32; temperature 0 is greedy (the project's rule;
  transformers refuses 0, and hf/generation_options.py still does); dividing by 1 is exact, so
  transformers' "only when != 1" gives the same numbers.
- top-k: the k-th best logit and everything equal to it stay (k 0 = off), as transformers'
  TopKLogitsWarper (`scores < topk(scores, k)[-1]` goes).
- top-p, two tie policies (`top_p_ties`, static):
  - "keep" (the project's `Sample`): sorted best first, a token stays while the probability
    mass strictly before it is < top_p (after top-k), and every token equal to the least
    likely kept one stays too, so the set does not depend on how a sort orders equal logits.
  - "transformers" (Hugging Face `generate`, which promises transformers' semantics): its
    TopPLogitsWarper exactly: a stable ascending sort, cumulative probability from the least
    likely token, a token goes while that is <= 1 - top_p (`top_p_cut`: transformers' Python
    `1 - top_p` rounded to float32 on the host; default 1 - top_p in float32), the best
    (min_tokens_to_keep = 1) always stays. Of two equal tokens at the cut it can drop the
    first (lower index) and keep the other: the stable sort puts the lower index first.
  Without ties at the cut both keep the same set (tests/test_decode_engine.py).
`use_top_k` / `use_top_p` are compile-time switches (Hugging Face's plan turns unused filters
off so their sorts are not compiled); the numbers are traced.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def first_argmax(scores: jax.Array) -> jax.Array:
    """argmax over the last axis, the first index among equal maxima, int32.

    Written as max + min-index: two plain reductions, which XLA on CPU runs much faster than
    its variadic argmax reduction."""
    best = jnp.max(scores, axis=-1, keepdims=True)
    index = jnp.arange(scores.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(scores == best, index, scores.shape[-1]), axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class ChooseGreedy:
    """The most likely token."""

    needs_key = False

    def __call__(self, logits: jax.Array, key=None) -> jax.Array:
        return first_argmax(logits)


@dataclasses.dataclass(frozen=True)
class ChooseSample:
    """A draw from softmax(logits / temperature) after top-k and top-p (module docstring).
    The numbers may be traced arrays; temperature 0 gives the greedy token."""

    temperature: float | jax.Array = 1.0
    top_k: int | jax.Array = 0
    top_p: float | jax.Array = 1.0
    use_top_k: bool = True  # static: compile the top-k filter
    use_top_p: bool = True  # static: compile the top-p filter
    top_p_ties: Literal["keep", "transformers"] = "keep"  # static (module docstring)
    top_p_cut: float | jax.Array | None = None  # "transformers": 1 - top_p as the host rounds it

    needs_key = True

    def __post_init__(self):
        if self.top_p_ties not in ("keep", "transformers"):
            raise ValueError(
                "ChooseSample: top_p_ties must be 'keep' or 'transformers', "
                f"got {self.top_p_ties!r}"
            )

    def __call__(self, logits: jax.Array, key: jax.Array) -> jax.Array:
        greedy = first_argmax(logits)
        temperature = self.temperature
        logits = logits.astype(jnp.float32) / jnp.where(temperature > 0, temperature, 1.0)
        logits = self.filtered(logits)
        sampled = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        return jnp.where(temperature > 0, sampled, greedy)

    def filtered(self, logits: jax.Array) -> jax.Array:
        """logits (R, V) float32 with the tokens outside top-k / top-p set to -inf."""
        if not (self.use_top_k or self.use_top_p):
            return logits
        if self.top_p_ties == "transformers":
            return self._filtered_as_transformers(logits)
        ranked = jnp.sort(logits, axis=-1)[:, ::-1]  # (R, V) best first
        cut = jnp.full(logits.shape[:1] + (1,), NEG_INF, logits.dtype)  # (R, 1)
        if self.use_top_k:  # below the k-th best logit goes (ties with it stay)
            cut = self._top_k_cut(ranked)
            ranked = jnp.where(ranked < cut, NEG_INF, ranked)
        if self.use_top_p:  # the smallest best-first set whose probability reaches top_p
            probs = jax.nn.softmax(ranked, axis=-1)
            mass_before = jnp.cumsum(probs, axis=-1) - probs
            kept = jnp.where(mass_before < self.top_p, ranked, jnp.inf)
            least_likely_kept = jnp.min(kept, axis=-1, keepdims=True)
            cut = jnp.where(self.top_p < 1.0, jnp.maximum(cut, least_likely_kept), cut)
        return jnp.where(logits < cut, NEG_INF, logits)

    def _top_k_cut(self, ranked: jax.Array) -> jax.Array:
        """(R, 1) the k-th best logit of `ranked` (R, V) best first; -inf when k is 0."""
        top_k = self.top_k
        kth_best = jnp.take(ranked, jnp.clip(top_k, 1, ranked.shape[1]) - 1, axis=1)[:, None]
        return jnp.where(top_k > 0, kth_best, NEG_INF)

    def _filtered_as_transformers(self, logits: jax.Array) -> jax.Array:
        """TopKLogitsWarper then TopPLogitsWarper (min_tokens_to_keep 1), as transformers runs
        them: top-p sees the top-k-filtered scores."""
        if self.use_top_k:
            cut = self._top_k_cut(jnp.sort(logits, axis=-1)[:, ::-1])
            logits = jnp.where(logits < cut, NEG_INF, logits)
        if not self.use_top_p:
            return logits
        vocab = logits.shape[-1]
        order = jnp.argsort(logits, axis=-1, stable=True)  # ascending; equal logits by index
        ascending = jnp.take_along_axis(logits, order, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        top_p_cut = 1.0 - self.top_p if self.top_p_cut is None else self.top_p_cut
        remove = (cumulative <= top_p_cut) & (jnp.arange(vocab) < vocab - 1)  # the best stays
        remove &= self.top_p < 1.0  # transformers runs no top-p warper at top_p 1
        rows = jnp.arange(logits.shape[0])[:, None]
        remove = jnp.zeros_like(remove).at[rows, order].set(remove)  # back to token order
        return jnp.where(remove, NEG_INF, logits)
