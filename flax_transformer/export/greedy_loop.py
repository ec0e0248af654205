"""Greedy decoding around any "tokens so far -> next-token logits" function, in numpy.

The reference loop for runtimes without this project's KV-cached decoder (onnxruntime, the
TorchScript int8 model): it recomputes the decoder over the prefix at every step, and chooses
exactly as `decoding.generate(..., Greedy())` does: prompts longer than the shortest are forced,
the first EOS is kept, pad after it, (B, max_new_tokens) tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def greedy_loop(
    next_logits: Callable[[np.ndarray], np.ndarray],
    prompts: np.ndarray,
    lengths: np.ndarray,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
) -> np.ndarray:
    """prompts (B, P) right-padded, lengths (B,) >= 1; next_logits(prefix (B, n) int64) gives
    the logits (B, V) after the prefix's last position. Returns int32 (B, max_new_tokens)."""
    batch, width = prompts.shape
    lengths = np.asarray(lengths)
    buffer = np.full((batch, width + max_new_tokens), pad_id, np.int64)
    buffer[:, :width] = prompts
    out = np.full((batch, max_new_tokens), pad_id, np.int32)
    finished = np.zeros(batch, bool)
    rows = np.arange(batch)
    for pos in range(int(lengths.min()), width + max_new_tokens):  # the position being chosen
        new_index = pos - lengths  # < 0 while the prompt is still being read
        if np.all(finished | (new_index >= max_new_tokens)):
            break
        chosen = np.argmax(next_logits(buffer[:, :pos]), axis=-1)
        chosen = np.where(finished, pad_id, chosen)
        forced = pos < lengths
        token = np.where(forced, buffer[:, pos], chosen)
        buffer[:, pos] = token
        write = (new_index >= 0) & (new_index < max_new_tokens)
        out[rows[write], new_index[write]] = token[write]
        finished |= ~forced & (token == eos_id)
    return out


def seq2seq_prompts(batch: int, bos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The decoder's prompts of a seq2seq model: BOS alone, (B, 1), lengths ones."""
    return np.full((batch, 1), bos_id, np.int64), np.ones(batch, np.int64)


def lm_prompt_lengths(prompts: np.ndarray, pad_id: int) -> np.ndarray:
    """The lengths of right-padded prompts: their non-pad token counts."""
    return (np.asarray(prompts) != pad_id).sum(axis=1)
