"""Data: built-in tasks, TSV corpora, LM text, and a deterministic bucketing batch loader.

Sequence conventions (byte tokenizer default, pad=0, bos=1, eos=2):
  seq2seq: src = encode(source) + [eos]; tgt_in = [bos] + encode(target);
           tgt_out = encode(target) + [eos]
  LM:      tokens = [bos] + encode(text) + [eos]; tgt_in = tokens[:-1]; tgt_out = tokens[1:],
           and tgt_weights 1 on every target (the EOS counts even when pad_id == eos_id)
  chat:    tokens = the chat template's ids (data/chat.py), shifted as an LM's, and a per-token
           loss weight tgt_weights (1 on the assistant replies, 0 elsewhere)
Batches are dicts of int32 numpy arrays padded with pad_id: seq2seq {"src", "tgt_in",
"tgt_out"}, LM {"tgt_in", "tgt_out"}, all (batch, bucket_len), and "tgt_weights" (float32, 0
on padding) when the data set has weights; a classifier's (--task classify) {"src" (batch,
bucket_len), "labels" (batch,)}.
"""

from __future__ import annotations

import dataclasses
import string
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flax_transformer.data.packing import pack_examples, plan_packed_batches
from flax_transformer.data.token_batches import plan_token_batches
from flax_transformer.files.text_lines import BOM, LineDecodeError, decode_line, split_lines
from flax_transformer.spec.kinds import ENCODER, LM, SEQ2SEQ

TASKS = ("copy", "reverse", "sort")
# Not a generated task: fine-tune an --init-from encoder as a classifier of --train-tsv's
# `text<TAB>label` lines (labelled.py).
CLASSIFY = "classify"
LONG_POLICIES = ("skip", "truncate", "error")


class DataError(ValueError):
    """Bad training data; the message names the file and line."""


# ----------------------------------------------------------------------------- raw text
@dataclasses.dataclass(frozen=True)
class Pair:
    """One training example as text: source and target (an LM document is its target, with an
    empty source), and where it came from for messages."""

    source: str
    target: str
    where: str  # "file:line" or "task:index", for messages


def task_target(task: str, source: str) -> str:
    """The target a built-in task makes of `source`: copy, reverse or sort its characters;
    DataError for an unknown task."""
    if task == "copy":
        return source
    if task == "reverse":
        return source[::-1]
    if task == "sort":
        return "".join(sorted(source))
    raise DataError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


def generate_task(
    task: str,
    num: int,
    seed: int,
    min_len: int,
    max_len: int,
    alphabet: str = string.ascii_lowercase,
) -> list[Pair]:
    """`num` random strings over `alphabet` with lengths in [min_len, max_len], and targets."""
    if not 1 <= min_len <= max_len:
        raise DataError(f"task lengths need 1 <= min_len <= max_len, got {min_len}..{max_len}")
    task_target(task, "")  # validates the name
    rng = np.random.default_rng(seed)
    letters = np.array(list(alphabet))
    lengths = rng.integers(min_len, max_len + 1, size=num)
    pairs = []
    for i, length in enumerate(lengths):
        source = "".join(rng.choice(letters, size=length))
        pairs.append(Pair(source, task_target(task, source), f"{task}:{i}"))
    return pairs


def held_out(pairs: list[Pair], train: list[Pair]) -> list[Pair]:
    """`pairs` without sources seen in training and without repeats: a true held-out set."""
    seen = {p.source for p in train}
    kept = []
    for pair in pairs:
        if pair.source not in seen:
            seen.add(pair.source)
            kept.append(pair)
    return kept


def task_pairs(
    task: str, train_size: int, valid_size: int, seed: int, min_len: int, max_len: int
) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, validation pairs) of a built-in task: the validation pairs from another
    seed, without a source seen in training (a true held-out set)."""
    train = generate_task(task, train_size, seed, min_len, max_len)
    valid = held_out(generate_task(task, valid_size, seed + 1_000_003, min_len, max_len), train)
    warn_if_validation_is_training(train, valid)
    return train, valid


def read_lines(path: str | Path, what: str) -> list[str]:
    """Lines of a UTF-8 file (a leading BOM dropped), with errors that name the file and line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"{what} {path}: cannot read ({err.strerror or err})") from None
    if not raw.removeprefix(BOM).strip():
        raise DataError(f"{what} {path}: the file is empty")
    texts = []
    for number, line in enumerate(split_lines(raw), start=1):
        try:
            texts.append(decode_line(line))
        except LineDecodeError as err:
            raise DataError(f"{what} {path} line {number}: {err}") from None
    return texts


def sources_of(pairs: list[Pair]) -> str:
    """The file(s) (or task) `pairs` came from, for messages: their `where` without the line."""
    names = dict.fromkeys(p.where.rsplit(":", 1)[0] for p in pairs)
    return ", ".join(names) if names else "no data"


def overlap_warning(train: list[Pair], valid: list[Pair]) -> str | None:
    """A warning when the validation pairs are (mostly) training pairs: the scores would then
    measure memorisation, not generalisation. None when most validation pairs are new."""
    seen = {(p.source, p.target) for p in train}
    shared = sum((p.source, p.target) in seen for p in valid)
    identical = {(p.source, p.target) for p in valid} == seen
    return overlap_text(shared, len(valid), identical)


def overlap_text(shared: int, total: int, identical: bool) -> str | None:
    """overlap_warning's message from counts: `shared` of `total` validation pairs occur in
    training; `identical`: both sets hold the same pairs. None when most are new."""
    if not total or shared * 2 <= total:
        return None
    if shared == total and identical:
        return (
            f"the validation set is the training set ({shared} identical pairs): scores will "
            "not measure generalisation"
        )
    return (
        f"{shared} of {total} validation pairs also occur in the training set: scores "
        "will overstate generalisation"
    )


def warn_if_validation_is_training(train: list[Pair], valid: list[Pair]) -> None:
    """Print `overlap_warning` (once, on stderr) when there is one."""
    import sys

    message = overlap_warning(train, valid)
    if message:
        print(f"warning: {message}", file=sys.stderr)


def tsv_pair(path, number: int, line: str, names=("source", "target")) -> Pair | None:
    """One line of a TSV corpus as a Pair (None for a blank line); DataError naming the file
    and line when it is not exactly one non-empty `source<TAB>target` (`names`: what the two
    fields are called in messages, e.g. ("text", "label") for --task classify)."""
    if not line.strip():
        return None
    if line.count("\t") != 1:
        problem = "no tab" if "\t" not in line else f"{line.count(chr(9))} tabs"
        raise DataError(
            f"TSV file {path} line {number}: {problem}; expected exactly one "
            f"'{names[0]}<TAB>{names[1]}' pair per line, got {line[:60]!r}"
        )
    source, target = line.split("\t")
    if not source.strip() or not target.strip():
        side = names[0] if not source.strip() else names[1]
        raise DataError(f"TSV file {path} line {number}: empty {side}")
    return Pair(source, target, f"{path}:{number}")


def read_tsv(path: str | Path, names=("source", "target")) -> list[Pair]:
    """One `source<TAB>target` pair per line (`names`: as tsv_pair's); blank lines are
    skipped."""
    pairs = []
    for number, line in enumerate(read_lines(path, "TSV file"), start=1):
        pair = tsv_pair(path, number, line, names)
        if pair is not None:
            pairs.append(pair)
    if not pairs:
        raise DataError(f"TSV file {path}: no pairs found")
    return pairs


def read_text_lines(path: str | Path) -> list[Pair]:
    """Non-blank lines of a text file as LM documents (target only)."""
    docs = [
        Pair("", line, f"{path}:{number}")
        for number, line in enumerate(read_lines(path, "text file"), start=1)
        if line.strip()
    ]
    if not docs:
        raise DataError(f"text file {path}: no non-blank lines")
    return docs


# ----------------------------------------------------------------------------- encoding
@dataclasses.dataclass
class Dataset:
    """Encoded examples (lists of int32 arrays) and the text they came from."""

    tgt_in: list[np.ndarray]
    tgt_out: list[np.ndarray]
    src: list[np.ndarray] | None  # None for the decoder-only LM
    pairs: list[Pair]
    # Per target token, its weight in the loss (a chat's assistant replies: 1, the rest: 0;
    # an LM document's targets: all 1); None (seq2seq): every non-pad target counts
    # (training/steps.py).
    tgt_weights: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.tgt_in)

    @property
    def kind(self) -> str:
        """The model kind these examples train: LM without sources, else seq2seq."""
        return LM if self.src is None else SEQ2SEQ

    def head(self, count: int) -> Dataset:
        """The first `count` examples (all of them when there are fewer)."""
        src = None if self.src is None else self.src[:count]
        weights = None if self.tgt_weights is None else self.tgt_weights[:count]
        return Dataset(self.tgt_in[:count], self.tgt_out[:count], src, self.pairs[:count], weights)

    def lengths(self) -> np.ndarray:
        """Per example, the longest of its sequences (what its bucket must hold)."""
        tgt = np.array([len(t) for t in self.tgt_in])
        if self.src is None:
            return tgt
        return np.maximum(tgt, np.array([len(s) for s in self.src]))


def encode_pairs(pairs: list[Pair], tokenizer, max_len: int, on_long: str = "skip") -> Dataset:
    """Seq2seq examples. A sequence longer than max_len (eos/bos included) is skipped, truncated
    or an error, by `on_long`; skipping or truncating warns once with the count and first lines."""
    if on_long not in LONG_POLICIES:
        raise ValueError(f"on_long must be one of {LONG_POLICIES}, got {on_long!r}")
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    src, tgt_in, tgt_out, kept, long = [], [], [], [], []
    for pair in pairs:
        s, t = tokenizer.encode(pair.source), tokenizer.encode(pair.target)
        if max(len(s), len(t)) + 1 > max_len:
            long.append(pair.where)
            if on_long == "error":
                raise DataError(
                    f"{pair.where}: pair of {len(s)} + {len(t)} tokens does not fit max_len "
                    f"{max_len} (with bos/eos); raise --max-len or pass --on-long skip|truncate"
                )
            if on_long == "skip":
                continue
            s, t = s[: max_len - 1], t[: max_len - 1]
        src.append(np.array(s + [eos], np.int32))
        tgt_in.append(np.array([bos] + t, np.int32))
        tgt_out.append(np.array(t + [eos], np.int32))
        kept.append(pair)
    if long:
        warn_long_pairs(len(long), long, max_len, on_long, stacklevel=3)
    if not kept:
        raise no_pair_fits(sources_of(pairs), len(pairs), max_len)
    return Dataset(tgt_in, tgt_out, src, kept)


def warn_long_pairs(count: int, first, max_len: int, on_long: str, stacklevel: int = 2) -> None:
    """The one warning for `count` pairs over max_len that were skipped or truncated; `first`:
    where the first few are (file:line)."""
    action = "skipped" if on_long == "skip" else "truncated"
    warnings.warn(
        f"{count} pair(s) longer than max_len {max_len} were {action} "
        f"(first: {', '.join(list(first)[:3])})",
        stacklevel=stacklevel,
    )


def no_pair_fits(where, total: int, max_len: int) -> DataError:
    """The error for a data file none of whose `total` pairs fits max_len."""
    return DataError(
        f"{where}: no pair fits max_len {max_len} (all {total} are longer with bos/eos); "
        "raise --max-len"
    )


def check_dataset_ids(dataset: Dataset, vocab_size: int) -> None:
    """Every token id inside [0, vocab_size), or a DataError naming the example's file and line
    (ids outside would silently wrap or turn into NaN inside the jitted step)."""
    sequences = [dataset.tgt_in, dataset.tgt_out] + ([dataset.src] if dataset.src else [])
    for seqs in sequences:
        if not seqs:
            continue
        flat = np.concatenate(seqs)
        if flat.min() >= 0 and flat.max() < vocab_size:
            continue
        for index, seq in enumerate(seqs):
            bad = seq[(seq < 0) | (seq >= vocab_size)]
            if bad.size:
                raise DataError(
                    f"{dataset.pairs[index].where}: token id {int(bad[0])} is outside the "
                    f"model's vocabulary [0, {vocab_size}) (do the tokenizer and the config "
                    "disagree?)"
                )


@dataclasses.dataclass
class LabelledDataset:
    """Texts with a class each (--task classify): `src[i]` the tokens a sequence classifier
    reads (special tokens included), `labels[i]` its class number, `pairs[i].target` the label's
    name. Batches are {"src": (batch, bucket_len), "labels": (batch,)}, label -1 on padding
    rows (make_batch)."""

    src: list[np.ndarray]
    labels: np.ndarray  # (examples,) int32
    pairs: list[Pair]

    kind = ENCODER

    def __len__(self) -> int:
        return len(self.src)

    def head(self, count: int) -> LabelledDataset:
        """The first `count` examples (all of them when there are fewer)."""
        return LabelledDataset(self.src[:count], self.labels[:count], self.pairs[:count])

    def lengths(self) -> np.ndarray:
        """Per example, its token count (what its bucket must hold)."""
        return np.array([len(s) for s in self.src])

    def check_ids(self, vocab_size: int) -> None:
        """Every token id inside [0, vocab_size), or a DataError naming the file and line."""
        check_dataset_ids(Dataset([], [], self.src, self.pairs), vocab_size)


def encode_documents(docs: list[Pair], tokenizer, max_len: int) -> Dataset:
    """LM examples; a document longer than max_len is cut into consecutive windows. Every
    target weighs 1 (tgt_weights): the loss counts a window's targets by its length, not by
    `target != pad_id`, which would drop every EOS target of a model whose pad_id is its
    eos_id (Llama and Qwen checkpoints name no pad token)."""
    tgt_in, tgt_out, kept = [], [], []
    for doc in docs:
        tokens = [tokenizer.bos_id] + tokenizer.encode(doc.target) + [tokenizer.eos_id]
        for start in range(0, len(tokens) - 1, max_len):
            window = tokens[start : start + max_len + 1]
            tgt_in.append(np.array(window[:-1], np.int32))
            tgt_out.append(np.array(window[1:], np.int32))
            kept.append(doc)
    return Dataset(tgt_in, tgt_out, None, kept, [np.ones(len(t), np.float32) for t in tgt_out])


# ----------------------------------------------------------------------------- batching
def bucket_boundaries(max_len: int, smallest: int = 8) -> list[int]:
    """Padded lengths batches may have: 8, 16, 24, 32, 48, 64, 96, ... up to max_len.

    Few shapes means few jit compilations; steps of 1.5x bound the padding waste."""
    bounds, length = [], smallest
    while length < max_len:
        bounds.append(length)
        length = max(length + 8, int(length * 1.5) // 8 * 8)
    bounds.append(max_len)
    return bounds


def make_batch(dataset: Dataset, indices, length: int, batch_size: int, pad_id: int = 0):
    """Rows `indices` padded to (batch_size, length); missing rows are all padding (weight 0)."""

    def stack(seqs, fill=pad_id, dtype=np.int32):
        out = np.full((batch_size, length), fill, dtype)
        for row, i in enumerate(indices):
            tokens = seqs[i]  # (one read of an on-disk row)
            out[row, : len(tokens)] = tokens
        return out

    if isinstance(dataset, LabelledDataset):
        labels = np.full((batch_size,), -1, np.int32)  # -1: a padding row, no example
        labels[: len(indices)] = dataset.labels[np.asarray(indices, np.int64)]
        return {"src": stack(dataset.src), "labels": labels}
    batch = {"tgt_in": stack(dataset.tgt_in), "tgt_out": stack(dataset.tgt_out)}
    if dataset.src is not None:
        batch["src"] = stack(dataset.src)
    if getattr(dataset, "tgt_weights", None) is not None:  # (LM and chat examples)
        batch["tgt_weights"] = stack(dataset.tgt_weights, 0.0, np.float32)
    return batch


def plan_batches(dataset: Dataset, batch_size: int, max_len: int, rng=None):
    """[(bucket_len, example indices)] covering every example once.

    With `rng`, examples are shuffled before bucketing and batches are shuffled after; without,
    the order is fixed (evaluation)."""
    bounds = np.array(bucket_boundaries(max_len))
    # Small index types: on a corpus of millions of examples these arrays are the plan's
    # memory (int16 bucket numbers, int32 example indices; the same values as int64).
    bucket_of = np.searchsorted(bounds, dataset.lengths()).astype(np.int16)  # (examples,)
    count = len(dataset)
    order = rng.permutation(count) if rng is not None else np.arange(count)
    order = order.astype(np.int32 if count < 2**31 else np.int64)
    ordered = bucket_of[order]
    plan = []
    for number in np.unique(ordered):
        members, bucket = order[ordered == number], int(bounds[number])
        for start in range(0, len(members), batch_size):
            plan.append((bucket, members[start : start + batch_size]))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


class BatchLoader:
    """Endless shuffled batches, deterministic from (seed, epoch).

    Its position {"epoch", "index"} is all a checkpoint needs to continue exactly: an epoch's
    plan is recomputed from the seed. `rows` (multi-process training): build only these rows
    of each batch, (rows.stop - rows.start, bucket_len) arrays; every process plans the same
    global batches."""

    def __init__(
        self, dataset: Dataset, batch_size: int, max_len: int, seed: int, pad_id=0, rows=None,
        batch_tokens: int | None = None, multiple: int = 1, pack: bool = False,
        local_rows: Callable[[int], slice] | None = None,
    ):  # fmt: skip
        self.dataset, self.batch_size, self.max_len = dataset, batch_size, max_len
        self.seed, self.pad_id = seed, pad_id
        self.rows = rows or slice(0, batch_size)
        # --batch-tokens: batches of at most that many (padded) tokens a side, `multiple` rows
        # at a time (data/token_batches.py); then batch_size and rows are not used.
        self.batch_tokens, self.multiple = batch_tokens, multiple
        # ... and with several processes, `local_rows(rows)` is this process's block of a
        # batch of `rows` rows (batches differ in rows, so the block differs too).
        self.local_rows = local_rows
        # --pack: each batch is batch_size rows of max_len tokens, several examples a row
        # (data/packing.py); the plan holds each row's example indices.
        self.pack = pack
        self.epoch, self.index = 0, 0
        self._plan_epoch, self._plan = None, []

    def state(self) -> dict[str, int]:
        """The loader's position {"epoch", "index"}, all a checkpoint needs to continue exactly."""
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        """Continue from a position that `state` returned."""
        self.epoch, self.index = int(state["epoch"]), int(state["index"])

    def _epoch_plan(self):
        if self._plan_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            if self.pack:
                order = rng.permutation(len(self.dataset))
                self._plan = plan_packed_batches(self.dataset, self.batch_size, self.max_len, order)
            elif self.batch_tokens is None:
                self._plan = plan_batches(self.dataset, self.batch_size, self.max_len, rng)
            else:
                bounds = bucket_boundaries(self.max_len)
                lengths = self.dataset.lengths()
                plan = plan_token_batches(lengths, self.batch_tokens, bounds, rng, self.multiple)
                self._plan = [(length, (rows, indices)) for length, rows, indices in plan]
            self._plan_epoch = self.epoch
        return self._plan

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.index >= len(self._epoch_plan()):
            self.epoch, self.index = self.epoch + 1, 0
        if self.pack:
            row_indices = self._epoch_plan()[self.index]
            self.index += 1
            batch = pack_examples(
                self.dataset, row_indices, self.batch_size, self.max_len, self.pad_id
            )
            return {name: array[self.rows] for name, array in batch.items()}
        length, indices = self._epoch_plan()[self.index]
        self.index += 1
        if self.batch_tokens is not None:  # (rows, indices): this bucket's row count
            rows, indices = indices
            if self.local_rows is None:
                return make_batch(self.dataset, indices, length, rows, self.pad_id)
            block = self.local_rows(rows)
            count = block.stop - block.start
            return make_batch(self.dataset, indices[block], length, count, self.pad_id)
        rows = self.rows  # rows past the examples of a short batch are padding
        return make_batch(self.dataset, indices[rows], length, rows.stop - rows.start, self.pad_id)


def eval_batches(dataset: Dataset, batch_size: int, max_len: int, pad_id: int = 0):
    """[(indices, batch)] over the whole set once, in a fixed order."""
    return [
        (indices, make_batch(dataset, indices, length, batch_size, pad_id))
        for length, indices in plan_batches(dataset, batch_size, max_len)
    ]
