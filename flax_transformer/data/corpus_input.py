"""A training run's corpus file as its input, read, tokenized and handed to the loop in the
steps runs/train.py takes (kind, read, bpe_texts, datasets, install, discard):

- `CorpusInput`: --train-tsv, --train-jsonl of pairs or {"text"} records, --lm-text: checked in
  a streaming pass, tokenized once into the run directory's token cache (token_cache.py) and
  read from it lazily; --resume reuses the cache.
- `ChatInput`: a --train-jsonl of conversations (`{"messages": [...]}`, one a line; chat.py)
  for a decoder LLM fine-tuned from an --init-from run (an `ftx hf import` of a Llama,
  Mistral, Qwen, Gemma, Phi-3, ... checkpoint whose tokenizer carries a chat template). Each
  conversation is rendered with the run tokenizer's chat template into the ids the model
  reads, with a loss weight of 1 on the assistant replies (the template's spans, a reply's
  end-of-turn token included) and 0 on the rest: the fine-tune learns to answer, not to write
  the user's turns. The conversations are read into memory (fine-tuning sets are small).

The built-in tasks stay in memory (pipeline.task_pairs); a classifier's labelled TSV is a
ClassifyInput (classify_input.py; its labels come from the --init-from run). The classes take
plain paths and values: runs/train_data.py makes them from the TrainSpec.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from flax_transformer.data import corpus, token_cache
from flax_transformer.data.chat import read_chat_jsonl
from flax_transformer.data.corpus import held_out_indices
from flax_transformer.data.finetune import encode_finetune_records
from flax_transformer.data.pipeline import DataError
from flax_transformer.spec.kinds import LM


class CorpusInput:
    """One run's corpus: `read` checks the files (the first pass, unless the run's cache can
    answer), `datasets` finds or builds the token cache, `install` moves a new cache into the
    run directory, `discard` removes a cache that was never installed."""

    def __init__(self, source, kind: str, seed: int, bpe: bool, tokenizer_name: str):
        """`source`: (format, training file, validation format, validation file or None);
        `kind`: the model kind of the data; `seed`: the held-out share's; `bpe`: a new BPE
        tokenizer trains on the scan's sample; `tokenizer_name`: the run directory's
        tokenizer file (its bytes are the token cache's key)."""
        self.kind, self.seed, self.bpe, self.tokenizer_name = kind, seed, bpe, tokenizer_name
        self.fmt, self.path, self.valid_fmt, self.valid_path = source
        self.valid_pairs, self.scan, self.held, self.staged = None, None, (), None
        self.key = None

    def read(self, scan: bool) -> None:
        """Read the validation file (small: in memory) and, when `scan`, check the training
        file in a streaming pass (corpus.scan_corpus); prints the overlap warning and the
        held-out count."""
        if self.valid_path:
            valid_kind = self.kind if self.valid_fmt == "jsonl" else None
            self.valid_pairs = corpus.read_records(self.valid_path, self.valid_fmt, valid_kind)
        if not scan:
            return
        self.scan = corpus.scan_corpus(
            self.path, self.fmt, self._jkind, self.valid_pairs,
            sample_size=corpus.BPE_SAMPLE_RECORDS if self.bpe else 0, seed=self.seed,
        )  # fmt: skip
        if self.scan.overlap:
            print(f"warning: {self.scan.overlap}", file=sys.stderr)
        if not self.valid_path:
            if self.scan.count < 2:
                raise DataError(
                    "need at least 2 training examples to hold some out for validation; "
                    "pass a validation file"
                )
            self.held = corpus.held_out_indices(self.scan.count, self.seed)
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

        saved = Path(workdir) / self.tokenizer_name
        sha = token_cache.tokenizer_fingerprint(tokenizer, saved if saved.exists() else None)
        holdout = None
        if not self.valid_path:
            holdout = {"seed": self.seed, "fraction": corpus.VALID_FRACTION,
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


class ChatInput:
    """One chat fine-tune's conversations: the training file's, and the validation file's or a
    held-out share of the training file's."""

    kind = LM

    def __init__(self, train_path, valid_path, seed: int):
        """The training file, the validation file (None: a held-out share of the training
        file's, drawn with `seed`)."""
        self.train_path, self.valid_path, self.seed = train_path, valid_path, seed
        self.train_chats: list = []
        self.valid_chats: list | None = None

    def read(self, scan: bool) -> None:
        """Read the conversations (into memory; read, like every input, here and not when the
        input is made); hold out a seeded share for validation when no --valid-jsonl is given
        (the same records on --resume: the same seed)."""
        self.train_chats = read_chat_jsonl(self.train_path)
        self.valid_chats = read_chat_jsonl(self.valid_path) if self.valid_path else None
        if self.valid_chats is not None:
            return
        if len(self.train_chats) < 2:
            raise DataError(
                "need at least 2 training conversations to hold some out for validation; "
                "pass --valid-jsonl"
            )
        held = set(held_out_indices(len(self.train_chats), self.seed).tolist())
        chats = self.train_chats
        self.valid_chats = [c for i, c in enumerate(chats) if i in held]
        self.train_chats = [c for i, c in enumerate(chats) if i not in held]
        print(f"held out {len(self.valid_chats)} of {len(chats)} conversations for validation")

    def bpe_texts(self):
        """No BPE is trained: the tokenizer is the --init-from run's."""
        return iter(())

    def datasets(self, tokenizer, max_len: int, on_long: str, workdir: Path, primary: bool):
        """(training set, validation set): each conversation as the template's ids with the
        assistant mask as its tgt_weights; a DataError naming the file for a tokenizer
        without a chat template."""
        from flax_transformer.hf.chat_template import ChatTemplate, ChatTemplateError

        try:
            template = ChatTemplate.of_tokenizer(tokenizer)
        except ChatTemplateError as err:
            raise DataError(
                f"chat JSONL file {self.train_path}: {err}; a chat fine-tune renders "
                "each conversation with it"
            ) from None

        def encode(chats):
            return encode_finetune_records(
                chats, "chat", tokenizer, max_len, template=template, on_long=on_long
            )

        return encode(self.train_chats), encode(self.valid_chats)

    def install(self, workdir: Path, train_set) -> None:
        """Nothing to move: the sets are in memory."""

    def discard(self) -> None:
        """Nothing was staged."""
