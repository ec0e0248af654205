"""Corpus files read as a stream, one record a line, without holding the corpus in memory.

Three formats: TSV (`source<TAB>target`, seq2seq), JSONL (one JSON object a line:
`{"source": ..., "target": ...}` for seq2seq or `{"text": ...}` for an LM; the first record
decides the kind and every line must follow it) and plain text (one LM document a line). Blank
lines are skipped; a bad line is a DataError naming the file and line.

`scan_corpus` is the first of the two passes a large corpus gets (the second is
token_cache.build_cache): it checks every line, counts the records, cuts the file into chunks
of whole lines (byte ranges the second pass can encode in parallel), counts the validation
pairs that also occur in training, and keeps a bounded reservoir sample of the records for
training a BPE tokenizer. Its memory does not grow with the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from flax_transformer.data.pipeline import DataError, Pair, overlap_text, tsv_pair
from flax_transformer.files.text_lines import BOM, LineDecodeError, decode_line
from flax_transformer.spec.kinds import LM, SEQ2SEQ

FORMATS = ("tsv", "jsonl", "text")
WHAT = {"tsv": "TSV file", "jsonl": "JSONL file", "text": "text file"}
# A BPE tokenizer is trained on at most this many records: a reservoir sample (uniform over
# the whole file, seeded, in file order; the whole corpus when it is smaller), so a sorted or
# clustered corpus is still represented, at a memory bound that does not grow with the file.
BPE_SAMPLE_RECORDS = 100_000
# Without a validation file, a seeded 5% of the records is held out, at most VALID_CAP of them
# (they are kept in memory and decoded at every evaluation). Below VALID_CAP / 5% = 40,000
# records this is the same split as before the cache.
VALID_FRACTION = 0.05
VALID_CAP = 2000
CHUNK_RECORDS = 8192  # records per chunk of the second pass
JSONL_FIELDS = {SEQ2SEQ: ("source", "target"), LM: ("text",)}


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def json_record(line: str, where: str):
    """One JSONL line's value; DataError naming `where` (the file and line) for text that is
    not JSON or nests too deeply to read."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:  # bad input (exit 2), not a failed run
        raise DataError(f"{where}: JSON nested too deeply to read") from None


def jsonl_pair(path, number: int, line: str, kind: str | None) -> Pair | None:
    """One JSONL line as a Pair (None for a blank line); `kind` (seq2seq or lm; None: any)
    is the kind the file's first record set. DataError naming the file and line for a line
    that is not JSON, not an object, or whose fields are missing, not strings or empty."""
    if not line.strip():
        return None
    where = f"JSONL file {path} line {number}"
    record = json_record(line, where)
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {_json_type(record)}")
    found = LM if "text" in record and "source" not in record else SEQ2SEQ
    if kind is not None and found != kind:
        wanted = " and ".join(f'"{f}"' for f in JSONL_FIELDS[kind])
        raise DataError(
            f"{where}: expected {wanted} like the file's first record, got fields "
            f"{', '.join(sorted(record)) or 'none'}"
        )
    for field in JSONL_FIELDS[found]:
        if field not in record:
            raise DataError(f'{where}: missing "{field}"')
        value = record[field]
        if not isinstance(value, str):
            raise DataError(f'{where}: "{field}" must be a string, got {_json_type(value)}')
        if not value.strip():
            raise DataError(f'{where}: empty "{field}"')
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:  # JSON's "\ud800" escape decodes to no character
            raise DataError(
                f'{where}: "{field}" holds a lone surrogate {value[err.start]!r} (character '
                f"{err.start + 1}), which is not text"
            ) from None
    if found == LM:
        return Pair("", record["text"], f"{path}:{number}")
    return Pair(record["source"], record["target"], f"{path}:{number}")


def parse_line(fmt: str, path, number: int, line: str, kind: str | None = None) -> Pair | None:
    """One decoded line of a `fmt` file as a Pair, None when blank; DataError when bad."""
    if fmt == "tsv":
        return tsv_pair(path, number, line)
    if fmt == "jsonl":
        return jsonl_pair(path, number, line, kind)
    return Pair("", line, f"{path}:{number}") if line.strip() else None


def raw_lines(path, fmt: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The raw lines (newline kept) of bytes [start, end) of a file, read as a stream;
    start and end must fall on line boundaries. DataError when the file cannot be read."""
    check_regular_file(path, fmt)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            left = None if end is None else end - start
            for raw in handle:
                if left is not None:
                    if left <= 0:
                        return
                    left -= len(raw)
                yield raw
    except OSError as err:
        raise DataError(f"{WHAT[fmt]} {path}: cannot read ({err.strerror or err})") from None


def check_regular_file(path, fmt: str) -> None:
    """A corpus must be a file: it is read more than once (its kind, the check, then the
    tokenization in parallel chunks) and its token cache is keyed by its bytes. A DataError
    for a pipe or a process substitution (`<(cat ...)`), which can be read only once."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as err:
        raise DataError(f"{WHAT[fmt]} {path}: cannot read ({err.strerror or err})") from None
    if not regular:
        raise DataError(
            f"{WHAT[fmt]} {path} is a pipe or device, not a file: a corpus is read more than "
            "once; write it to a file first (e.g. `cat ... > corpus.tsv`)"
        )


def decode(fmt: str, path, number: int, raw: bytes) -> str:
    """A raw line as text (BOM of line 1 and the newline dropped); DataError if not UTF-8."""
    raw = raw.removesuffix(b"\n").removesuffix(b"\r")
    if number == 1:
        raw = raw.removeprefix(BOM)
    try:
        return decode_line(raw)
    except LineDecodeError as err:
        raise DataError(f"{WHAT[fmt]} {path} line {number}: {err}") from None


def records(path, fmt: str, kind: str | None = None) -> Iterator[Pair]:
    """Every record of a corpus file, in order, as a stream (no emptiness check)."""
    for number, raw in enumerate(raw_lines(path, fmt), start=1):
        pair = parse_line(fmt, path, number, decode(fmt, path, number, raw), kind)
        if pair is not None:
            yield pair


def jsonl_kind(path) -> str:
    """The model kind a JSONL file trains, from its first non-blank line (checked in full)."""
    for pair in records(path, "jsonl"):
        return LM if not pair.source else SEQ2SEQ
    raise DataError(f"JSONL file {path}: the file is empty")


CHAT = "chat"  # a JSONL file of {"messages"} conversations (data/chat.py)


def jsonl_source(path) -> str:
    """What a JSONL training file holds, from one read of its first non-blank line: CHAT for a
    {"messages"} conversation, else the model kind its record trains (LM or SEQ2SEQ; the line
    checked in full). DataError for an empty file or a bad first line."""
    for number, raw in enumerate(raw_lines(path, "jsonl"), start=1):
        line = decode("jsonl", path, number, raw)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            record = None  # (jsonl_pair names the problem)
        if isinstance(record, dict) and "messages" in record:
            return CHAT
        return LM if not jsonl_pair(path, number, line, None).source else SEQ2SEQ
    raise DataError(f"JSONL file {path}: the file is empty")


def read_records(path, fmt: str, kind: str | None = None) -> list[Pair]:
    """A small corpus (a validation file) in memory: its records, DataError when it has none."""
    if fmt == "jsonl" and kind is None:
        kind = jsonl_kind(path)
    pairs = list(records(path, fmt, kind))
    if not pairs:
        empty = not any(raw.strip() for raw in raw_lines(path, fmt))
        found = "no non-blank lines" if fmt == "text" else "no pairs found"
        raise DataError(f"{WHAT[fmt]} {path}: {'the file is empty' if empty else found}")
    return pairs


@dataclasses.dataclass
class Scan:
    """What the first pass over a corpus found: the record count, the chunks of the second
    pass ((byte start, byte end, first line number, first record index)), a bounded sample of
    (record index, Pair) in file order, and the overlap warning with the validation pairs."""

    path: Path
    fmt: str
    kind: str
    count: int
    chunks: list[tuple[int, int, int, int]]
    sample: list[tuple[int, Pair]]
    overlap: str | None = None


def scan_corpus(path, fmt: str, kind: str, valid=None, sample_size=0, seed=0) -> Scan:
    """Check every line of a corpus file and count its records, as a stream (see the module
    docstring); `valid`: validation pairs to count in the training data (the overlap
    warning); `sample_size`: records to keep in a seeded reservoir sample (0: none)."""
    rng = random.Random(seed)
    valid_keys = {(p.source, p.target) for p in valid or ()}
    seen_valid, other = set(), False
    chunks, sample, count, content = [], [], 0, False
    position, chunk_start, chunk_line, chunk_first = 0, 0, 1, 0
    number = 0
    for number, raw in enumerate(raw_lines(path, fmt), start=1):
        if count - chunk_first >= CHUNK_RECORDS:
            chunks.append((chunk_start, position, chunk_line, chunk_first))
            chunk_start, chunk_line, chunk_first = position, number, count
        position += len(raw)
        content = content or bool(raw.removeprefix(BOM).strip())
        pair = parse_line(fmt, path, number, decode(fmt, path, number, raw), kind)
        if pair is None:
            continue
        if valid_keys:
            key = (pair.source, pair.target)
            if key in valid_keys:
                seen_valid.add(key)
            else:
                other = True
        if sample_size:
            if count < sample_size:
                sample.append((count, pair))
            else:
                slot = rng.randrange(count + 1)
                if slot < sample_size:
                    sample[slot] = (count, pair)
        count += 1
    if not content:
        raise DataError(f"{WHAT[fmt]} {path}: the file is empty")
    if not count:
        found = "no non-blank lines" if fmt == "text" else "no pairs found"
        raise DataError(f"{WHAT[fmt]} {path}: {found}")
    chunks.append((chunk_start, position, chunk_line, chunk_first))
    sample.sort(key=lambda item: item[0])
    overlap = None
    if valid:
        shared = sum((p.source, p.target) in seen_valid for p in valid)
        identical = not other and seen_valid == valid_keys
        overlap = overlap_text(shared, len(valid), identical)
    return Scan(Path(path), fmt, kind, count, chunks, sample, overlap)


def held_out_indices(count: int, seed: int) -> np.ndarray:
    """The sorted record indices held out for validation when no validation file is given:
    a seeded 5% (at least 1, at most VALID_CAP), the same records as
    cli/train.split_off_validation picks for a corpus under VALID_CAP / 5% records."""
    chosen = max(1, int(count * VALID_FRACTION))
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[: min(chosen, VALID_CAP)])


def sample_texts(scan: Scan, held=()) -> Iterator[str]:
    """The non-empty texts of the scan's sample, held-out records left out (BPE training)."""
    held = set(np.asarray(held).tolist())
    for index, pair in scan.sample:
        if index not in held:
            yield from (t for t in (pair.source, pair.target) if t)
