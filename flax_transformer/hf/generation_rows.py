"""The prompts as Hugging Face generation sees them: `Rows` (model input and transformers'
layout side by side), and `write_column`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Rows:
    """The prompts as the search sees them (all (B, ...) int32); the engine's prompts."""

    tokens: jax.Array  # (B, P) real prompt tokens first (right-padded): the model's input
    lengths: jax.Array  # (B,) real prompt tokens per row
    pads: jax.Array  # (B,) left padding in transformers' layout (P - lengths)
    seq: jax.Array  # (B, max_length) transformers' layout: prompt as given, then fill

    def forced(self, pos):
        """(B,) bool: the token at position `pos` is still the prompt's, not a choice."""
        return pos < self.lengths

    def token_at(self, pos):
        """tokens[:, pos] (B,), clamped inside the prompt (the value is only used where forced)."""
        pos = jnp.minimum(pos, self.tokens.shape[1] - 1)
        return jax.lax.dynamic_index_in_dim(self.tokens, pos, axis=1, keepdims=False)


def write_column(seq, col, token, where):
    """seq (R, L) with token (R,) written at column col (R,) in the rows where `where`."""
    hit = (jnp.arange(seq.shape[1])[None, :] == col[:, None]) & where[:, None]
    return jnp.where(hit, token[:, None], seq)
