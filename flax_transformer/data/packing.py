"""Sequence packing (`--pack`): several examples in one row, so that short examples do not pay
for padding.

A packed batch carries, beside the usual token arrays, per-token segment ids (1, 2, ... for the
examples of a row; 0 for padding) and per-example positions (0, 1, ... restarting at each
example), all (rows, length) int32:

    src, tgt_in, tgt_out, src_segments, tgt_segments, src_positions, tgt_positions  (seq2seq)
    tgt_in, tgt_out, tgt_segments, tgt_positions                                    (LM)
    + tgt_weights (float32) when the examples carry loss weights (a chat data set)

From them `packed_model_kwargs` builds what keeps examples apart: encoder self-attention within
a source segment, decoder self-attention within a target segment and causal, cross-attention
from a target segment to the source segment of the same example; the loss is per token, and
padding (segment 0, pad targets) weighs nothing. A packed batch therefore gives every example
the logits, loss and gradients it has alone in a row (tests/test_packing.py: float64, ~1e-12,
in Flax and in the torch twin).

Rows are filled first-fit in the (shuffled) order of the examples: an example goes into the
first row with room for its source and its target; a batch is `rows` rows of `length` tokens,
one shape for the whole run (one compilation).
"""

from __future__ import annotations

import numpy as np

from flax_transformer.nn.attention import (
    combine_masks,
    make_causal_mask,
    make_padding_mask,
    make_segment_mask,
)
from flax_transformer.spec.kinds import LM

PACKED_KEYS = ("tgt_segments", "tgt_positions", "src_segments", "src_positions")


class PackingError(ValueError):
    """An example longer than a packed row."""


def is_packed(batch) -> bool:
    """Does `batch` carry segment ids (a packed batch)?"""
    return "tgt_segments" in batch


def _sides(dataset) -> list:
    """The sequences a row must hold room for: (source, target) or the LM's target."""
    return [dataset.tgt_in] if dataset.src is None else [dataset.src, dataset.tgt_in]


def _lengths(sequences) -> np.ndarray:
    """(examples,) lengths: from the offsets of an on-disk cache (RaggedTokens.lengths), or
    counted for in-memory lists."""
    if hasattr(sequences, "lengths"):
        return np.asarray(sequences.lengths())
    return np.array([len(seq) for seq in sequences])


def plan_packed_batches(dataset, rows: int, length: int, order) -> list[list[list[int]]]:
    """Batches of `rows` rows, each row a list of example indices that fit in `length` tokens on
    every side, filled first-fit in `order`; a batch is closed when an example fits none of
    its rows. Every example of `order` is placed exactly once."""
    lengths = np.stack([_lengths(seq) for seq in _sides(dataset)], axis=1)  # (examples, sides)
    too_long = np.flatnonzero((lengths > length).any(axis=1))
    if too_long.size:
        first = int(too_long[0])
        pairs = getattr(dataset, "pairs", None)  # (an on-disk cache keeps no text)
        where = pairs[first].where if pairs is not None else f"example {first + 1}"
        raise PackingError(f"{where}: an example longer than the packed row length {length}")
    batches, current, used = [], [], []
    for index in order:
        need = lengths[index]
        row = next((r for r, room in enumerate(used) if (room + need <= length).all()), None)
        if row is None and len(current) == rows:  # no room in this batch: close it
            batches.append(current)
            current, used = [], []
        if row is None:
            current.append([int(index)])
            used.append(need.copy())
        else:
            current[row].append(int(index))
            used[row] += need
    if current:
        batches.append(current)
    return batches


def pack_examples(dataset, row_indices: list[list[int]], rows: int, length: int, pad_id=0):
    """The packed batch (arrays (rows, length)) of the examples `row_indices` (one list per row;
    rows beyond them are all padding)."""
    names = ["tgt_in", "tgt_out"] + ([] if dataset.src is None else ["src"])
    batch = {name: np.full((rows, length), pad_id, np.int32) for name in names}
    if getattr(dataset, "tgt_weights", None) is not None:  # padding weighs 0
        names.append("tgt_weights")
        batch["tgt_weights"] = np.zeros((rows, length), np.float32)
    sides = ["tgt"] + ([] if dataset.src is None else ["src"])
    for side in sides:
        batch[f"{side}_segments"] = np.zeros((rows, length), np.int32)
        batch[f"{side}_positions"] = np.zeros((rows, length), np.int32)
    for row, indices in enumerate(row_indices):
        starts = {"tgt": 0, "src": 0}
        for segment, index in enumerate(indices, start=1):
            for name in names:
                side = "src" if name == "src" else "tgt"
                seq = getattr(dataset, name)[index]
                start = starts[side]
                batch[name][row, start : start + len(seq)] = seq
            for side in sides:
                size = len((dataset.src if side == "src" else dataset.tgt_in)[index])
                start = starts[side]
                batch[f"{side}_segments"][row, start : start + size] = segment
                batch[f"{side}_positions"][row, start : start + size] = np.arange(size)
                starts[side] = start + size
    return batch


def batch_model_kwargs(batch, kind: str, config) -> dict:
    """What a batch adds to the model call beyond its token arrays: for a packed batch the
    masks and positions of packed_model_kwargs, else nothing (the model's own defaults)."""
    return packed_model_kwargs(batch, kind, config) if is_packed(batch) else {}


def packed_model_kwargs(batch, kind: str, config) -> dict:
    """The keyword arguments that make the model see each packed example alone: masks from the
    segment ids, per-example positions. Keys holding pad_id are hidden as the unpacked
    defaults hide them (the source always, the target with config.mask_target_padding), so a
    real token equal to pad_id (e.g. Marian's decoder start) is treated the same way."""
    tgt = batch["tgt_segments"]
    causal = make_causal_mask(tgt.shape[1])
    tgt_pad = make_padding_mask(batch["tgt_in"], config.pad_id)
    tgt_keys = tgt_pad if config.mask_target_padding else None
    self_mask = combine_masks(make_segment_mask(tgt, tgt), causal, tgt_keys)  # (rows, 1, T, T)
    if kind == LM:
        return {"mask": self_mask, "positions": batch["tgt_positions"]}
    src = batch["src_segments"]
    src_keys = make_padding_mask(batch["src"], config.pad_id)  # (rows, 1, 1, S)
    return {
        "src_mask": combine_masks(make_segment_mask(src, src), src_keys),
        "tgt_mask": self_mask,
        "cross_mask": combine_masks(make_segment_mask(tgt, src), src_keys),  # (rows, 1, T, S)
        "src_positions": batch["src_positions"],
        "tgt_positions": batch["tgt_positions"],
    }
