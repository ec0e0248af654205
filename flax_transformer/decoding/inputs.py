"""What the decoder is fed: user inputs checked and turned into `Prompts` (and a `Source`).

A *prompt* is what the decoder is fed before it chooses freely: `[bos]` for the seq2seq
`Transformer` (whose encoder reads the `Source` once), the right-padded prompt tokens for
`TransformerLM`. The common prefix of the prompts (`min(lengths)` tokens) is prefilled in one
call; past that, an example whose prompt is longer is *forced*: its prompt token is fed instead
of a chosen one. So a ragged batch decodes exactly as each example would alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flax_transformer.nn.attention import make_padding_mask
from flax_transformer.nn.kinds import is_lm
from flax_transformer.nn.token_ids import check_token_array, check_token_ids


@struct.dataclass
class Prompts:
    """Right-padded prompts: tokens (B, P) int32 and their lengths (B,) int32, 1..P each.

    Built on the host (numpy): the shortest length is a compile-time constant."""

    tokens: jax.Array
    lengths: jax.Array

    def forced(self, pos: jax.Array) -> jax.Array:
        """(B,) bool: the token at position `pos` is still the prompt's, not a choice."""
        return pos < self.lengths

    def token_at(self, pos: jax.Array) -> jax.Array:
        """tokens[:, pos] (B,), clamped inside the prompt (the value is only used where forced)."""
        pos = jnp.minimum(pos, self.tokens.shape[1] - 1)
        return jax.lax.dynamic_index_in_dim(self.tokens, pos, axis=1, keepdims=False)


@struct.dataclass
class Source:
    """A seq2seq source: tokens (B, S) int32 and the cross-attention key mask (B, 1, 1, S)."""

    tokens: jax.Array
    mask: jax.Array


def check_common(model, max_new_tokens: int, eos_id) -> None:
    """ValueError unless `max_new_tokens` is a positive int and `eos_id` (when given: one id or
    a non-empty sequence of ids) lies inside the model's target vocabulary."""
    if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    vocab = model.config.tgt_vocab_size
    ids = [] if eos_id is None else eos_ids_of(eos_id)
    if eos_id is not None and not ids:
        raise ValueError("eos_id is an empty sequence; give None for no EOS")
    for one in ids:
        if not 0 <= one < vocab:
            raise ValueError(f"eos_id {one} is outside the target vocabulary (size {vocab})")


def eos_ids_of(eos_id) -> list[int]:
    """One id or a sequence of ids, as a list of ints."""
    if isinstance(eos_id, int | np.integer):
        return [int(eos_id)]
    return [int(one) for one in eos_id]


def eos_array(eos_id, vocab: int) -> jax.Array:
    """What the selectors trace: () int32 for one id (-1 for None: never stops), or a (vocab,)
    bool table of the ids for several (a chat model's end ids)."""
    if eos_id is None or isinstance(eos_id, int | np.integer):
        return jnp.asarray(-1 if eos_id is None else eos_id, jnp.int32)
    return jnp.zeros((vocab,), bool).at[jnp.asarray(eos_ids_of(eos_id))].set(True)


def seq2seq_inputs(model, src, src_mask, max_new_tokens: int, bos_id: int | None):
    """(Prompts of [bos], Source) for a seq2seq Transformer; src (B, S) padded with pad_id."""
    cfg = model.config
    if bos_id is None:
        raise ValueError("decoding a seq2seq Transformer needs bos_id (the decoder's first token)")
    src = jnp.asarray(check_token_array("src", src))
    if src.shape[1] > cfg.max_len:
        raise ValueError(f"src has length {src.shape[1]}, longer than max_len {cfg.max_len}")
    check_token_ids("src", src, cfg.src_vocab_size)
    if not 0 <= bos_id < cfg.tgt_vocab_size:
        raise ValueError(
            f"bos_id {bos_id} is outside the target vocabulary [0, {cfg.tgt_vocab_size})"
        )
    if max_new_tokens > cfg.max_len:
        raise ValueError(f"max_new_tokens {max_new_tokens} is longer than max_len {cfg.max_len}")
    batch = src.shape[0]
    if src_mask is None:
        src_mask = make_padding_mask(src, cfg.pad_id)
    src_mask = jnp.asarray(src_mask)
    if jnp.issubdtype(src_mask.dtype, jnp.floating):
        raise ValueError("src_mask must be a boolean key mask (True = attend), not a float bias")
    try:  # the cross-attention key mask, one row per example (beam search tiles it)
        src_mask = jnp.broadcast_to(src_mask, (batch, 1, 1, src.shape[1]))
    except ValueError:
        raise ValueError(
            f"src_mask of shape {src_mask.shape} does not broadcast to (batch, 1, 1, src_len) "
            f"= {(batch, 1, 1, src.shape[1])}"
        ) from None
    prompts = Prompts(np.full((batch, 1), bos_id, np.int32), np.ones((batch,), np.int32))
    return prompts, Source(src.astype(jnp.int32), src_mask.astype(bool))


def lm_inputs(model, prompts, lengths, max_new_tokens: int) -> Prompts:
    """Prompts for a TransformerLM from right-padded host token ids (B, P), each starting with
    BOS; lengths (B,) default to the count of non-pad tokens. Host values: the prefill length
    min(lengths) is a compile-time constant."""
    cfg = model.config
    prompts = np.asarray(check_token_array("prompts", prompts))
    check_token_ids("prompts", prompts, cfg.tgt_vocab_size)
    if lengths is None:
        lengths = (prompts != cfg.pad_id).sum(axis=1)  # right-padded prompts
    lengths = np.asarray(lengths, dtype=np.int32)
    if lengths.shape != prompts.shape[:1]:
        raise ValueError(f"lengths {lengths.shape} must be (batch,) for prompts {prompts.shape}")
    if lengths.min() < 1 or lengths.max() > prompts.shape[1]:
        raise ValueError(
            f"every prompt needs 1..{prompts.shape[1]} tokens (start with BOS), got lengths "
            f"{lengths.tolist()}"
        )
    width = int(lengths.max())
    if width + max_new_tokens - 1 > cfg.max_len:
        raise ValueError(
            f"prompt length {width} + max_new_tokens {max_new_tokens} exceeds the model's "
            f"max_len {cfg.max_len} (+1)"
        )
    return Prompts(prompts[:, :width].astype(np.int32), lengths)


def decoder_inputs(model, inputs, *, lengths, src_mask, max_new_tokens, bos_id, eos_id):
    """Checked (Prompts, Source or None) for either kind of model."""
    check_common(model, max_new_tokens, eos_id)
    if is_lm(model):
        if src_mask is not None:
            raise ValueError("src_mask is for a seq2seq Transformer; an LM takes prompt lengths")
        if bos_id is not None:
            raise ValueError(
                "bos_id is for a seq2seq Transformer; an LM's prompts start with their own BOS"
            )
        return lm_inputs(model, inputs, lengths, max_new_tokens), None
    if lengths is not None:
        raise ValueError("lengths is for an LM's prompts; a seq2seq source takes src_mask")
    return seq2seq_inputs(model, inputs, src_mask, max_new_tokens, bos_id)
