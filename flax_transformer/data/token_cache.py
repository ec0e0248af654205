"""The on-disk token cache of a training corpus: tokenized once, in a streaming pass, read lazily.

Format. One directory per (corpus, tokenizer, length policy), under the run directory's
`token_cache/` (TOKEN_CACHE, listed in runs/run_dir.py), named
`train-<16 hex digits of the key's sha256>`:

    tgt.tokens   int32, every example's target row end to end: [bos] + target + [eos] for
                 seq2seq (truncated as encode_pairs truncates), an LM window of up to
                 max_len + 1 tokens; tgt_in is a row without its last token, tgt_out without
                 its first (the shifted views cost no second copy)
    tgt.offsets  int64, N + 1 offsets into tgt.tokens (row i is tokens[off[i]:off[i + 1]])
    src.tokens, src.offsets   the same for sources (source + [eos]); seq2seq only
    lines        int64, N: each example's line in the corpus (for messages)
    lengths      int32, N: each example's longest sequence (what plan_batches buckets by)
    valid.jsonl  the held-out validation records, when no validation file was given
    meta.json    the key, the counts, the largest token id, the length-policy warning and
                 each file's size and blake2b checksum; written last. A cache whose files
                 differ from the record is never read (find_cache: DamagedCache)

No loss weights are stored: an LM example's targets all weigh 1, so its tgt_weights follow
from the offsets (WholeTargets), as encode_documents gives them in memory; the EOS target then
counts even when the model's pad_id is its eos_id.

Why raw numpy files (read with os.pread) rather than Arrow, HDF5 or one .npy per example:
the loader needs random access to single rows (the epoch plan shuffles), a row is one
positioned read (os.pread, no parsing; see ArrayFile for why not a memory map), the OS page
cache shares the pages between runs and drops them under pressure, the files can be written
with sequential appends while streaming, and numpy is already a dependency. The resident
memory of a run therefore does not grow with the corpus, apart from the per-example length
array that plan_batches needs (a few bytes per example).

Key. The corpus file (resolved path, size, blake2b of its bytes), the sha256 of the tokenizer
file exactly as the run directory stores it, max_len, on_long, the model kind, the format
version and, when validation records are held out of the file, the seed and the hold-out rule.
Any change makes a new directory (and the old one is removed when the new one is installed);
--resume finds the same key, so it never tokenizes again.

Writing is all or nothing: the cache is built in a staging directory beside the run directory
(the run directory itself is made only once all input has been read and checked), and renamed
into place in one step (install_cache). The second pass encodes chunks of whole lines in a
pool of worker processes (spawned: the parent may hold JAX's threads) while the parent appends
their arrays to the files in order; a small corpus is encoded in the parent.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np

from flax_transformer.data import corpus
from flax_transformer.data.pipeline import (
    LONG_POLICIES,
    DataError,
    Pair,
    no_pair_fits,
    warn_long_pairs,
)
from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.files.stages import OWNER, make_stage, release_stage
from flax_transformer.spec.kinds import LM, SEQ2SEQ

# The cache's folder in a run directory (runs/run_dir.py lists it with the other names).
TOKEN_CACHE = "token_cache"
VERSION = 3  # 3: keyed by the corpus's bytes, each file's size and checksum in meta.json
META = "meta.json"
STAGE_PREFIX = ".token_cache.partial-"
DIGEST_BLOCK = 1 << 20
VALID = "valid.jsonl"
POOL_MIN_BYTES = 8 << 20  # a smaller corpus is encoded in the parent (a pool costs ~1 s)


# ----------------------------------------------------------------------------- the dataset
class ArrayFile:
    """A flat numpy file read with os.pread, a slice at a time.

    Not a memory map on purpose: the kernel maps up to 16 neighbouring pages into a process on
    every page fault of a file map (fault-around), and those pages count as the process's
    resident memory until it exits. Randomly sampled rows of a map therefore add the corpus's
    size to a long run's RSS; pread copies only the bytes asked for into memory that is freed
    with the batch. Opened lazily per process (the object pickles by path)."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self._fd = None
        self.size = self.path.stat().st_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.size

    def read(self, start: int, stop: int) -> np.ndarray:
        """Items [start, stop), a new read-only array; DataError when the file was cut short."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        itemsize = self.dtype.itemsize
        count = max(stop - start, 0) * itemsize
        data = os.pread(self._fd, count, start * itemsize)
        if len(data) != count:
            raise DataError(
                f"{self.path}: the token cache file is shorter than its index says "
                f"(items {start}..{stop} of {self.size}); delete {self.path.parent} to rebuild it"
            )
        return np.frombuffer(data, self.dtype)

    def read_all(self) -> np.ndarray:
        """The whole file (for per-example arrays of a few bytes an example)."""
        return np.fromfile(self.path, self.dtype)

    def __getstate__(self):
        return {**self.__dict__, "_fd": None}

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class RaggedTokens:
    """A sequence of int32 rows stored end to end (`tokens`, an ArrayFile) with N + 1
    `offsets` (an ArrayFile); `head` / `tail` tokens are left off every row (the shifted
    tgt_in / tgt_out views)."""

    def __init__(self, tokens: ArrayFile, offsets: ArrayFile, head: int = 0, tail: int = 0):
        self.tokens, self.offsets, self.head, self.tail = tokens, offsets, head, tail

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _bounds(self, index) -> tuple[int, int]:
        """(start, end) of row `index` in `tokens`, head and tail left off."""
        index = int(index)
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        index %= len(self)
        start, end = (int(x) for x in self.offsets.read(index, index + 2))
        return start + self.head, end - self.tail

    def __getitem__(self, index) -> np.ndarray:
        return self.tokens.read(*self._bounds(index))

    def row_length(self, index) -> int:
        """Row `index`'s length, from its two offsets (no token read)."""
        start, end = self._bounds(index)
        return end - start

    def lengths(self) -> np.ndarray:
        """Every row's length, vectorised from the offsets (8 bytes an example, read once)."""
        return np.diff(self.offsets.read_all()) - (self.head + self.tail)


class WholeTargets:
    """The tgt_weights of an LM cache, from the lengths it stores: row i is 1 on each of the
    row's targets, made when asked (no file). A target counts because it is inside its
    example, not because it differs from pad_id: `target != pad_id` would drop every EOS target
    of a model whose pad_id is its eos_id (Llama, Qwen); the padding past a row weighs 0
    (make_batch, pack_examples)."""

    def __init__(self, targets: RaggedTokens):
        self.targets = targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index) -> np.ndarray:
        return np.ones(self.targets.row_length(index), np.float32)


class CachedDataset:
    """A training set read lazily from a token cache directory: the `src` / `tgt_in` /
    `tgt_out` rows, len() and lengths() that BatchLoader, plan_batches and make_batch use,
    like data.Dataset; no text is kept (`pairs` is None). An LM cache's examples carry
    tgt_weights as encode_documents' do (WholeTargets); a seq2seq cache's none, as
    encode_pairs' (every non-pad target counts)."""

    pairs = None
    tgt_weights = None

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / META).read_text())

        def load(name, dtype):
            return ArrayFile(self.directory / name, dtype)

        tgt_tokens, tgt_offsets = load("tgt.tokens", np.int32), load("tgt.offsets", np.int64)
        self.tgt_in = RaggedTokens(tgt_tokens, tgt_offsets, tail=1)
        self.tgt_out = RaggedTokens(tgt_tokens, tgt_offsets, head=1)
        self.src = None
        if self.meta["key"]["kind"] == SEQ2SEQ:
            self.src = RaggedTokens(load("src.tokens", np.int32), load("src.offsets", np.int64))
        else:
            self.tgt_weights = WholeTargets(self.tgt_out)
        self.lines = load("lines", np.int64)

    def __len__(self) -> int:
        return len(self.tgt_in)

    @property
    def kind(self) -> str:
        """The model kind these examples train: LM without sources, else seq2seq."""
        return LM if self.src is None else SEQ2SEQ

    def lengths(self) -> np.ndarray:
        """Per example, the longest of its sequences (what its bucket must hold): int32, read
        from the `lengths` file (4 bytes an example, no page of the offsets touched)."""
        return np.fromfile(self.directory / "lengths", np.int32)

    def check_ids(self, vocab_size: int) -> None:
        """data.check_dataset_ids for the cache: every id inside [0, vocab_size), or a
        DataError naming the first example's file and line (from the largest id in meta)."""
        if self.meta["max_id"] < vocab_size:
            return
        path = self.meta["key"]["input"]["path"]
        for seqs in (self.tgt_in, self.src):
            for index in range(len(seqs) if seqs is not None else 0):
                bad = seqs[index][seqs[index] >= vocab_size]
                if bad.size:
                    line = int(self.lines.read(index, index + 1)[0])
                    raise DataError(
                        f"{path}:{line}: token id {int(bad[0])} is outside "
                        f"the model's vocabulary [0, {vocab_size}) (do the tokenizer and the "
                        "config disagree?)"
                    )


# ----------------------------------------------------------------------------- the key
def tokenizer_fingerprint(tokenizer, saved: Path | None = None) -> str:
    """sha256 of the tokenizer file: `saved` (the run directory's tokenizer.json) when given,
    else what tokenizer.save writes (the same bytes the run directory will hold)."""
    if saved is not None:
        return hashlib.sha256(Path(saved).read_bytes()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(Path(tmp) / "tokenizer.json")
        return hashlib.sha256((Path(tmp) / "tokenizer.json").read_bytes()).hexdigest()


def cache_key(path, fmt, kind, tokenizer_sha, max_len, on_long, holdout=None) -> dict:
    """What a cache depends on (see the module docstring); `holdout`: {"seed", "fraction",
    "cap"} when validation records are held out of the file."""
    return {
        "version": VERSION,
        "input": {"path": str(Path(path).resolve()), "size": Path(path).stat().st_size,
                  "blake2b": file_digest(path), "format": fmt},
        "tokenizer_sha256": tokenizer_sha,
        "max_len": int(max_len),
        "on_long": on_long if kind == SEQ2SEQ else None,
        "kind": kind,
        "holdout": holdout,
    }  # fmt: skip


def file_digest(path) -> str:
    """blake2b (16 bytes, hex) of a file's bytes, read in blocks: what keys a corpus's cache
    (a file rewritten with its size and mtime put back is still a new key) and checks each
    cache file. About 1 GB/s on one core."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(DIGEST_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def key_name(key: dict) -> str:
    """The cache directory's name for `key`: train-<16 hex digits of its sha256>."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"train-{digest[:16]}"


class DamagedCache(ValueError):
    """A cache directory whose files are not those its meta.json recorded (cut short,
    changed): never read; the message names the directory and the first bad file."""


def find_cache(workdir: Path, key: dict) -> Path | None:
    """The complete cache directory of `key` in the run directory, or None; DamagedCache when
    it is there but a file's size or checksum is not what was written (check_files)."""
    directory = Path(workdir) / TOKEN_CACHE / key_name(key)
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None
    problem = file_problem(directory, meta.get("files"))
    if problem:
        raise DamagedCache(f"the token cache {directory} is damaged ({problem})")
    return directory


def file_record(directory: Path) -> dict:
    """{file name: {"bytes", "blake2b"}} of every file of a built cache except meta.json."""
    return {
        path.name: {"bytes": path.stat().st_size, "blake2b": file_digest(path)}
        for path in sorted(Path(directory).iterdir())
        if path.name not in (META, OWNER)
    }


def file_problem(directory: Path, recorded) -> str | None:
    """What differs between the files of `directory` and their record in meta.json (sizes
    first: cheap), or None."""
    if not isinstance(recorded, dict) or not recorded:
        return "meta.json records no file sizes and checksums"
    for name, want in recorded.items():
        path = Path(directory) / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want.get("bytes"):
            return f"{name} has {size} bytes, {want.get('bytes')} were written"
    for name, want in recorded.items():
        if file_digest(Path(directory) / name) != want.get("blake2b"):
            return f"{name} does not match its checksum"
    return None


def read_valid(directory: Path) -> list[Pair]:
    """The validation records held out into the cache (empty when a file gave them)."""
    path = Path(directory) / VALID
    if not path.exists():
        return []
    return [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line]


# ----------------------------------------------------------------------------- staging
def stage_dir(workdir: Path) -> Path:
    """A fresh hidden staging directory beside (in the nearest existing parent of) the run
    directory: the same file system, so that install_cache is one rename."""
    parent = Path(workdir).absolute()
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    return make_stage(parent, STAGE_PREFIX)


def install_cache(staged: Path, workdir: Path, key: dict) -> Path:
    """Move a built cache into the run directory (one rename) and remove the run's other
    caches; its new path."""
    root = Path(workdir) / TOKEN_CACHE
    root.mkdir(exist_ok=True)
    release_stage(staged)
    target = root / key_name(key)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staged, target)
    for other in root.iterdir():
        if other != target:
            shutil.rmtree(other, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------- building
_WORKER = {}  # the pool worker's tokenizer and settings (set once by _init_worker)


def _init_worker(settings: dict) -> None:
    _WORKER.update(settings)


def _start_pool(workers: int, settings: dict):
    """A spawned pool whose workers ignore SIGINT from birth: Ctrl-C reaches the whole process
    group, and the parent alone answers it (one line, exit 130) and terminates the pool; a
    worker that took it printed its own KeyboardInterrupt traceback (~40 lines). An ignored
    signal stays ignored across exec, so the parent ignores it while the workers start
    (a few milliseconds; off the main thread signals cannot be changed, and are not needed)."""
    context = multiprocessing.get_context("spawn")
    if threading.current_thread() is not threading.main_thread():
        return context.Pool(workers, initializer=_init_worker, initargs=(settings,))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return context.Pool(workers, initializer=_init_worker, initargs=(settings,))
    finally:
        signal.signal(signal.SIGINT, previous)


def encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (the tokenizer's own batch encoding when it has one)."""
    batch = getattr(tokenizer, "encode_batch", None)
    return batch(texts) if batch else [tokenizer.encode(t) for t in texts]


def _encode_chunk(chunk) -> dict:
    """Encode one chunk of whole lines (corpus.Scan.chunks) with the length policy of
    data.encode_pairs (seq2seq) or the windows of data.encode_documents (LM)."""
    s = _WORKER
    start, end, first_line, first_record = chunk
    tok, kind, max_len, on_long = s["tokenizer"], s["kind"], s["max_len"], s["on_long"]
    held = s["held"][np.searchsorted(s["held"], first_record) :]
    held = set(held[: np.searchsorted(held, first_record + corpus.CHUNK_RECORDS)].tolist())
    kept, valid, index = [], [], first_record
    raws = corpus.raw_lines(s["path"], s["fmt"], start, end)
    for number, raw in enumerate(raws, start=first_line):
        text = corpus.decode(s["fmt"], s["path"], number, raw)
        pair = corpus.parse_line(s["fmt"], s["path"], number, text, kind)
        if pair is None:
            continue
        (valid if index in held else kept).append(pair)
        index += 1
    bos, eos = tok.bos_id, tok.eos_id
    targets = encode_batch(tok, [p.target for p in kept])
    src, tgt, lines, long = [], [], [], []
    if kind == SEQ2SEQ:
        sources = encode_batch(tok, [p.source for p in kept])
        for pair, s_ids, t_ids in zip(kept, sources, targets, strict=True):
            if max(len(s_ids), len(t_ids)) + 1 > max_len:
                long.append(pair.where)
                if on_long == "error":
                    raise DataError(
                        f"{pair.where}: pair of {len(s_ids)} + {len(t_ids)} tokens does not fit "
                        f"max_len {max_len} (with bos/eos); raise --max-len or pass --on-long "
                        "skip|truncate"
                    )
                if on_long == "skip":
                    continue
                s_ids, t_ids = s_ids[: max_len - 1], t_ids[: max_len - 1]
            src.append(s_ids + [eos])
            tgt.append([bos] + t_ids + [eos])
            lines.append(int(pair.where.rsplit(":", 1)[1]))
    else:
        for pair, ids in zip(kept, targets, strict=True):
            tokens = [bos] + ids + [eos]
            for begin in range(0, len(tokens) - 1, max_len):
                tgt.append(tokens[begin : begin + max_len + 1])
                lines.append(int(pair.where.rsplit(":", 1)[1]))

    def flat(rows):
        return (
            np.fromiter((t for row in rows for t in row), np.int32),
            np.array([len(row) for row in rows], np.int64),
        )

    lengths = np.array([len(row) - 1 for row in tgt], np.int32)  # tgt_in's
    if kind == SEQ2SEQ:
        lengths = np.maximum(lengths, np.array([len(row) for row in src], np.int32))
    return {"src": flat(src), "tgt": flat(tgt), "lines": np.array(lines, np.int64),
            "lengths": lengths,
            "long": long[:3], "long_count": len(long), "valid": valid}  # fmt: skip


class _Appender:
    """A tokens file and its offsets file, appended to chunk by chunk."""

    def __init__(self, directory: Path, name: str):
        self.tokens = open(directory / f"{name}.tokens", "wb")  # noqa: SIM115
        self.offsets = open(directory / f"{name}.offsets", "wb")  # noqa: SIM115
        self.offsets.write(np.zeros(1, np.int64).tobytes())
        self.total, self.max_id = 0, -1

    def append(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        self.tokens.write(tokens.tobytes())
        self.offsets.write((self.total + np.cumsum(lengths)).astype(np.int64).tobytes())
        self.total += int(lengths.sum())
        if tokens.size:
            self.max_id = max(self.max_id, int(tokens.max()))

    def close(self) -> None:
        for handle in (self.tokens, self.offsets):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()


def build_cache(staged: Path, scan, tokenizer, key: dict, held=(), workers=None) -> dict:
    """Tokenize the corpus of `scan` (corpus.scan_corpus) into the empty directory `staged`:
    the files of the module docstring, meta.json last; the held-out records (`held`: record
    indices) go to valid.jsonl. `workers`: pool size (None: the CPUs, and no pool for a small
    corpus). Returns meta. DataError for a pair too long under --on-long error, or when no
    example fits; the warning about skipped or truncated pairs is issued (warnings.warn)."""
    staged, kind = Path(staged), key["kind"]
    max_len, on_long = key["max_len"], key["on_long"] or "skip"
    if on_long not in LONG_POLICIES:
        raise ValueError(f"on_long must be one of {LONG_POLICIES}, got {on_long!r}")
    settings = {"tokenizer": tokenizer, "kind": kind, "max_len": max_len, "on_long": on_long,
                "path": str(scan.path), "fmt": scan.fmt,
                "held": np.asarray(held, np.int64)}  # fmt: skip
    if workers is None:
        small = scan.path.stat().st_size < POOL_MIN_BYTES or len(scan.chunks) < 2
        workers = 0 if small else min(len(os.sched_getaffinity(0)), len(scan.chunks))
    if tokenizer.kind not in ("byte", "bpe"):
        workers = 0  # (an imported Hugging Face tokenizer may not survive pickling)
    appenders = {"tgt": _Appender(staged, "tgt")}
    if kind == SEQ2SEQ:
        appenders["src"] = _Appender(staged, "src")
    long, long_count, examples = [], 0, 0
    pool = None
    try:
        with (
            open(staged / "lines", "wb") as lines,
            open(staged / "lengths", "wb") as lengths,
            open(staged / VALID, "w") as valid,
        ):
            if workers > 1:
                pool = _start_pool(workers, settings)
                results = pool.imap(_encode_chunk, scan.chunks)
            else:
                _init_worker(settings)
                results = map(_encode_chunk, scan.chunks)
            for result in results:
                for name, appender in appenders.items():
                    appender.append(*result[name])
                lines.write(result["lines"].tobytes())
                lengths.write(result["lengths"].tobytes())
                examples += len(result["lines"])
                long += result["long"][: 3 - len(long)]
                long_count += result["long_count"]
                for pair in result["valid"]:
                    valid.write(json.dumps(dataclass_dict(pair), ensure_ascii=False) + "\n")
    finally:
        if pool is not None:
            pool.terminate()
        for appender in appenders.values():
            appender.close()
    if long_count:
        warn_long_pairs(long_count, long, max_len, on_long, stacklevel=3)
    if not examples:
        raise no_pair_fits(scan.path, scan.count - len(held), max_len)
    max_id = max(a.max_id for a in appenders.values())
    meta = {"key": key, "examples": examples, "records": scan.count, "held_out": len(held),
            "max_id": max_id, "long_count": long_count,
            "files": file_record(staged)}  # fmt: skip
    atomic_write_text(staged / META, json.dumps(meta, indent=2) + "\n")
    return meta


def dataclass_dict(pair: Pair) -> dict:
    """A Pair as a JSON-able dict (valid.jsonl)."""
    return {"source": pair.source, "target": pair.target, "where": pair.where}
