"""Token batches for the parity report: checked, generated, or encoded from text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import ENCODER, INPUT_NAMES, LM, SEQ2SEQ


class ParityInputError(ValueError):
    """Inputs the report cannot run on: incompatible models, bad batch, unknown files."""


def check_batch(batch: Mapping[str, Any], config: TransformerConfig, model_kind: str) -> None:
    """ParityInputError unless `batch` holds every input `model_kind` needs as non-empty
    (batch, length) integer ids inside the vocabulary and no longer than max_len."""
    needed = INPUT_NAMES[model_kind]
    vocab = {"src": config.src_vocab_size, "tgt_in": config.tgt_vocab_size}
    for key in needed:
        if key not in batch:
            raise ParityInputError(f"the {model_kind} batch needs {needed}, missing {key!r}")
        tokens = np.asarray(batch[key])
        if tokens.ndim != 2 or tokens.shape[1] == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise ParityInputError(
                f"batch[{key!r}] must be (batch, length>0) int token ids, got {tokens.dtype} "
                f"{tokens.shape}"
            )
        if tokens.min() < 0 or tokens.max() >= vocab[key]:
            raise ParityInputError(
                f"batch[{key!r}] has token ids in [{tokens.min()}, {tokens.max()}], outside the "
                f"vocabulary of size {vocab[key]}"
            )
        if tokens.shape[1] > config.max_len:
            raise ParityInputError(
                f"batch[{key!r}] has length {tokens.shape[1]} > max_len {config.max_len}"
            )


def make_batch(
    config: TransformerConfig,
    model_kind: str,
    *,
    batch_size: int = 4,
    src_len: int = 16,
    tgt_len: int = 12,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random non-pad tokens with ragged padding (row i loses i/batch_size of its length).

    Row 0 is full, so every position appears at least once. Lengths are capped at max_len.
    """
    rng = np.random.default_rng(seed)

    def tokens(vocab: int, length: int) -> np.ndarray:
        length = min(length, config.max_len)
        ids = rng.integers(0, vocab - 1, (batch_size, length))
        ids = ids + (ids >= config.pad_id)  # skip pad_id
        for row in range(1, batch_size):
            ids[row, max(1, length - (row * length) // batch_size) :] = config.pad_id
        return ids.astype(np.int32)

    if model_kind == ENCODER:  # (a bare encoder has no target)
        return {"src": tokens(config.src_vocab_size, src_len)}
    batch = {"tgt_in": tokens(config.tgt_vocab_size, tgt_len)}  # (drawn first: same batches)
    if model_kind == SEQ2SEQ:
        batch = {"src": tokens(config.src_vocab_size, src_len)} | batch
    return batch


def batch_from_texts(
    tokenizer,
    texts: Sequence[str],
    model_kind: str,
    targets: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Token batch as training builds it (the helpers' contract), padded with pad_id.

    seq2seq: src = encode(text) + [eos], tgt_in = [bos] + encode(target) (target defaults to
    the text itself); LM: tgt_in = [bos] + encode(text); a bare encoder: src only.
    """
    if targets is not None and len(targets) != len(texts):
        raise ParityInputError(f"got {len(texts)} --input but {len(targets)} --target texts")
    pad = tokenizer.pad_id

    def padded(rows):
        length = max(len(r) for r in rows)
        return np.array([r + [pad] * (length - len(r)) for r in rows], dtype=np.int32)

    targets = list(targets) if targets is not None else list(texts)
    tgt_in = padded([[tokenizer.bos_id] + tokenizer.encode(t) for t in targets])
    if model_kind == LM:
        return {"tgt_in": tgt_in}
    src = padded([tokenizer.encode(t) + [tokenizer.eos_id] for t in texts])
    return {"src": src} if model_kind == ENCODER else {"src": src, "tgt_in": tgt_in}
