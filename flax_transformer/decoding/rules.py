"""How the next token is chosen from one row's logits: the engine's token rules.

- `first_argmax`: greedy, the first index among equal maxima (torch.argmax's choice, and
  jnp.argmax's), for the project's search and Hugging Face's alike.
- `ChooseGreedy()` / `ChooseSample(temperature, top_k, top_p)`: rule objects,
  `rule(logits (R, V), key) -> tokens (R,)`.

One sampling rule for both paths (before the engine the two disagreed on the details):
- temperature: logits / temperature in float32; temperature 0 is greedy (the project's rule;
  transformers refuses 0, and hf/generation_options.py still does); dividing by 1 is exact, so
  transformers' "only when != 1" gives the same numbers.
- top-k: the k-th best logit and everything equal to it stay (k 0 = off).
- top-p: sorted best first, a token stays while the probability mass strictly before it is
  < top_p (after top-k). Every token equal to the least likely kept one stays too, so the set
  does not depend on how a sort orders equal logits; transformers' TopPLogitsWarper (ascending
  sort, drop while cumulative <= 1 - top_p) can keep one of two equal tokens and drop the other.
  Its cumulative sum runs from the least likely token; this one adds the largest first.
  `tests/test_decode_engine.py` shows the tie case; it is the one behaviour change of the HF
  sampling path.
`use_top_k` / `use_top_p` are compile-time switches (Hugging Face's plan turns unused filters
off so their sorts are not compiled); the numbers are traced.
"""

from __future__ import annotations

import dataclasses

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

    needs_key = True

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
        ranked = jnp.sort(logits, axis=-1)[:, ::-1]  # (R, V) best first
        cut = jnp.full(logits.shape[:1] + (1,), NEG_INF, logits.dtype)  # (R, 1)
        if self.use_top_k:  # below the k-th best logit goes (ties with it stay)
            top_k = self.top_k
            kth_best = jnp.take(ranked, jnp.clip(top_k, 1, ranked.shape[1]) - 1, axis=1)[:, None]
            cut = jnp.where(top_k > 0, kth_best, NEG_INF)
            ranked = jnp.where(ranked < cut, NEG_INF, ranked)
        if self.use_top_p:  # the smallest best-first set whose probability reaches top_p
            probs = jax.nn.softmax(ranked, axis=-1)
            mass_before = jnp.cumsum(probs, axis=-1) - probs
            kept = jnp.where(mass_before < self.top_p, ranked, jnp.inf)
            least_likely_kept = jnp.min(kept, axis=-1, keepdims=True)
            cut = jnp.where(self.top_p < 1.0, jnp.maximum(cut, least_likely_kept), cut)
        return jnp.where(logits < cut, NEG_INF, logits)
