"""The training command's corpus files (--train-tsv, --train-jsonl, --lm-text): checked in a
streaming pass, tokenized once into the run directory's token cache (data/token_cache.py)
and read from it lazily; --resume reuses the cache. The built-in tasks stay in memory
(data/pipeline.task_pairs), and so does a --train-jsonl of conversations (runs/train_chat.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from flax_transformer.data import corpus, token_cache
from flax_transformer.runs.run_dir import TOKENIZER
from flax_transformer.spec.kinds import LM


def corpus_source(spec):
    """(format, training file, validation format, validation file or None) of the flags, or
    None for a built-in task."""
    valid = ("jsonl", spec.valid_jsonl) if spec.valid_jsonl else ("tsv", spec.valid_tsv)
    if spec.train_tsv:
        return "tsv", spec.train_tsv, *valid  # (either validation format: check_spec)
    if spec.train_jsonl:
        return "jsonl", spec.train_jsonl, *valid
    if spec.lm_text:
        return "text", spec.lm_text, "text", spec.lm_valid
    return None


def corpus_input(spec, source, kind: str):
    """The input of a corpus source whose data is `kind` (runs/checks.data_kind): a ChatInput
    for a --train-jsonl of {"messages"} records (CHAT), else a CorpusInput of that model kind."""
    if kind == corpus.CHAT:
        from flax_transformer.runs.train_chat import ChatInput

        return ChatInput(spec)
    return CorpusInput(spec, source, kind)


class CorpusInput:
    """One run's corpus: `read` checks the files (the first pass, unless the run's cache can
    answer), `datasets` finds or builds the token cache, `install` moves a new cache into the
    run directory, `discard` removes a cache that was never installed."""

    def __init__(self, spec, source, kind: str):
        self.spec, self.kind = spec, kind
        self.fmt, self.path, self.valid_fmt, self.valid_path = source
        self.valid_pairs, self.scan, self.held, self.staged = None, None, (), None
        self.key = None

    def read(self, scan: bool) -> None:
        """Read the validation file (small: in memory) and, when `scan`, check the training
        file in a streaming pass (corpus.scan_corpus); prints the overlap warning and the
        held-out count."""
        import sys

        if self.valid_path:
            valid_kind = self.kind if self.valid_fmt == "jsonl" else None
            self.valid_pairs = corpus.read_records(self.valid_path, self.valid_fmt, valid_kind)
        if not scan:
            return
        bpe = self.spec.tokenizer == "bpe" and not self.spec.init_from
        self.scan = corpus.scan_corpus(
            self.path, self.fmt, self._jkind, self.valid_pairs,
            sample_size=corpus.BPE_SAMPLE_RECORDS if bpe else 0, seed=self.spec.seed,
        )  # fmt: skip
        if self.scan.overlap:
            print(f"warning: {self.scan.overlap}", file=sys.stderr)
        if not self.valid_path:
            if self.scan.count < 2:
                from flax_transformer.runs.spec import UsageError

                raise UsageError(
                    "need at least 2 training examples to hold some out for validation; "
                    "pass a validation file"
                )
            self.held = corpus.held_out_indices(self.scan.count, self.spec.seed)
            print(f"held out {len(self.held)} of {self.scan.count} examples for validation")

    @property
    def _jkind(self):
        return self.kind if self.fmt == "jsonl" else None

    def bpe_texts(self):
        """The texts a new BPE tokenizer trains on: the scan's bounded sample."""
        return corpus.sample_texts(self.scan, self.held)

    def datasets(self, tokenizer, max_len: int, on_long: str, workdir: Path, primary: bool):
        """(training set, validation set): the training set from the run's cache for this key
        (--resume, or another process's run) or from a new one built into a staging
        directory (process 0; `install` moves it in); the validation set in memory."""
        from flax_transformer.data.pipeline import encode_documents, encode_pairs

        saved = Path(workdir) / TOKENIZER
        sha = token_cache.tokenizer_fingerprint(tokenizer, saved if saved.exists() else None)
        holdout = None
        if not self.valid_path:
            holdout = {"seed": self.spec.seed, "fraction": corpus.VALID_FRACTION,
                       "cap": corpus.VALID_CAP}  # fmt: skip
        self.key = token_cache.cache_key(
            self.path, self.fmt, self.kind, sha, max_len, on_long, holdout
        )
        try:
            directory = token_cache.find_cache(workdir, self.key)
        except token_cache.DamagedCache as err:
            if not primary:
                raise
            print(f"warning: {err}; it is rebuilt", file=sys.stderr)
            directory = None
        if directory is not None:
            print(
                f"reusing the token cache {directory} (the same {self.path}, tokenizer and max_len)"
            )
        if directory is None:
            if not primary:
                raise ValueError(
                    f"{workdir}: no token cache for {self.path} (process 0 writes it; did the "
                    "input change?)"
                )
            if self.scan is None:  # --resume of a run whose cache is gone or out of date
                print(f"tokenizing {self.path} again (its token cache is missing or stale)")
                self.read(scan=True)
            self.staged = token_cache.stage_dir(workdir)
            token_cache.build_cache(self.staged, self.scan, tokenizer, self.key, self.held)
            directory = self.staged
        train_set = token_cache.CachedDataset(directory)
        valid = self.valid_pairs or token_cache.read_valid(directory)
        if self.kind == LM:
            valid_set = encode_documents(valid, tokenizer, max_len)
        else:
            valid_set = encode_pairs(valid, tokenizer, max_len, on_long)
        return train_set, valid_set

    def install(self, workdir: Path, train_set) -> None:
        """Move a newly built cache into the run directory (process 0, after make_workdir);
        `train_set` reads it from there."""
        if self.staged is None:
            return
        directory = token_cache.install_cache(self.staged, workdir, self.key)
        self.staged = None
        train_set.__init__(directory)  # the same files, now under their final name

    def discard(self) -> None:
        """Remove a staged cache that was never installed (the run stopped before)."""
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None
