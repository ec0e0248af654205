"""Batches sized in tokens (`--batch-tokens N`), the way the paper batches: "each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens".

Examples are bucketed by length as for sentence batches (data.bucket_boundaries); a batch of
bucket length L holds `rows_for(L)` rows, the most that keep its *padded* source and its padded
target at or under N tokens each (rows * L <= N: what the step computes on, padding included).
Short examples make tall batches, long ones short batches, and the padding stays within a
bucket's 1.5x step. The row count of each bucket is fixed, so the step compiles once per
bucket: at most len(bucket_boundaries(max_len)) shapes (batch_shapes; 10 for max_len 256).
Rows are a multiple of `multiple` (micro-batches x data-parallel devices), so every batch
splits evenly.
"""

from __future__ import annotations

import numpy as np


class BatchTokensError(ValueError):
    """A token budget that cannot hold the longest bucket."""


def rows_for(length: int, batch_tokens: int, multiple: int = 1) -> int:
    """Rows of a batch whose sequences are padded to `length`: the most, in steps of
    `multiple`, with rows * length <= batch_tokens."""
    rows = (batch_tokens // length) // multiple * multiple  # multiple >= 1
    if rows == 0:
        raise BatchTokensError(
            f"--batch-tokens {batch_tokens} cannot hold {multiple} row(s) of {length} tokens "
            f"(the longest bucket is --max-len); use at least {length * multiple}"
        )
    return rows


def batch_shapes(batch_tokens: int, bounds, multiple: int = 1) -> list[tuple[int, int]]:
    """[(rows, bucket_len)] of every batch shape the step will see, one per bucket of `bounds`
    (data.bucket_boundaries(max_len)); BatchTokensError if the budget cannot hold a batch of
    the longest bucket."""
    rows_for(bounds[-1], batch_tokens, multiple)  # the longest first: the error names it
    return [(rows_for(length, batch_tokens, multiple), length) for length in bounds]


def logits_bytes(shapes, vocab_size: int, itemsize: int = 4) -> int:
    """The bytes of the largest batch's logits, rows x length x vocabulary: a lower bound on
    what one step of a batch shape holds (the activations come on top)."""
    return max(rows * length for rows, length in shapes) * vocab_size * itemsize


def available_memory() -> int | None:
    """The bytes this machine can still give (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_budget_fits(batch_tokens: int, shapes, vocab_size: int, available: int | None) -> None:
    """BatchTokensError when the largest batch's logits alone need more than `available`
    bytes: a budget far above the data used to fail with a MemoryError minutes later, after
    the run directory was made. The message gives the most that could fit."""
    if available is None:
        return
    need = logits_bytes(shapes, vocab_size)
    if need <= available:
        return
    rows, length = max(shapes, key=lambda shape: shape[0] * shape[1])
    most = available // (vocab_size * 4)
    raise BatchTokensError(
        f"--batch-tokens {batch_tokens}: a batch of {rows} rows x {length} tokens needs "
        f"{need / 2**30:.1f} GiB for its logits alone ({vocab_size} float32 scores a token); "
        f"this machine has {available / 2**30:.1f} GiB available: use at most {most} "
        "(the paper used about 25000)"
    )


def check_batch_tokens(batch_tokens: int, bounds, multiple: int, grad_accum: int, vocab_size: int):
    """A --batch-tokens budget must hold a batch of the longest bucket (the last of `bounds`),
    in rows that split into the `grad_accum` micro-batches and the data-parallel devices
    (`multiple` rows in all): a BatchTokensError (exit 2) before anything is written. Prints
    the batch shapes."""
    shapes = batch_shapes(batch_tokens, bounds, multiple)
    # A micro-batch (--grad-accum) is what one step holds at a time.
    micro = [(rows // grad_accum, length) for rows, length in shapes]
    check_budget_fits(batch_tokens, micro, vocab_size, available_memory())
    print(
        f"--batch-tokens {batch_tokens}: {len(shapes)} batch shapes (rows x length) "
        + ", ".join(f"{rows}x{length}" for rows, length in shapes)
    )


def plan_token_batches(lengths: np.ndarray, batch_tokens: int, bounds, rng=None, multiple=1):
    """[(bucket_len, rows, example indices)] covering every example once; `lengths` (examples,)
    as Dataset.lengths(), `bounds` the bucket lengths (data.bucket_boundaries). A batch of
    bucket L holds at most rows_for(L) examples (fewer in a bucket's last batch: the rest is
    padding). With `rng`, examples are shuffled before bucketing and batches after; without,
    the order is fixed."""
    batch_shapes(batch_tokens, bounds, multiple)
    bounds = np.asarray(bounds)
    buckets = bounds[np.searchsorted(bounds, lengths)]
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    plan = []
    for bucket in np.unique(buckets):
        rows = rows_for(int(bucket), batch_tokens, multiple)
        members = order[buckets[order] == bucket]
        for start in range(0, len(members), rows):
            plan.append((int(bucket), rows, members[start : start + rows]))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan
