"""The data of a decoder LLM's fine-tune (an `ftx hf import` run trained further), in memory:
one call for the three formats,

    text   a plain text file, one document a line (corpus.py's "text")
    jsonl  JSONL {"text": ...}, one document a line
    chat   JSONL {"messages": [...]}, one conversation a line (data/chat.py)

Documents become LM examples as everywhere in the project ([bos] + text + [eos], windows of
max_len: pipeline.encode_documents) and conversations the chat template's ids; either packs
several examples a row with BatchLoader(pack=True) (data/packing.py: each example sees only
itself). Every example carries loss weights (tgt_weights): 1 on every target of a document,
so that its EOS counts even when the model's pad_id is its eos_id (Llama and Qwen checkpoints
name no pad token, and `targets != pad_id` would drop every EOS target), and the assistant
mask for a conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

from flax_transformer.data import corpus
from flax_transformer.data.chat import encode_chats, read_chat_jsonl
from flax_transformer.data.pipeline import DataError, Dataset, check_dataset_ids, encode_documents
from flax_transformer.spec.kinds import LM

FORMATS = ("text", "jsonl", "chat")


def finetune_format(path: str | Path) -> str:
    """The format of a fine-tuning file: "chat" or "jsonl" for a .jsonl file (jsonl_format),
    else "text"."""
    if Path(path).suffix.lower() not in (".jsonl", ".json"):
        return "text"
    return jsonl_format(path)


def jsonl_format(path: str | Path) -> str:
    """ "chat" when the first non-blank line of a JSONL file is an object with "messages",
    else "jsonl" (the line's own problems are named by the reader of that format);
    DataError for a file without one."""
    for number, raw in enumerate(corpus.raw_lines(path, "jsonl"), start=1):
        line = corpus.decode("jsonl", path, number, raw)
        if line.strip():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                return "jsonl"  # (the JSONL reader names the problem)
            return "chat" if isinstance(record, dict) and "messages" in record else "jsonl"
    raise DataError(f"JSONL file {path}: the file is empty")


def read_finetune_records(path: str | Path, fmt: str | None = None) -> tuple[str, list]:
    """(format, records) of a fine-tuning file, every line checked: Pairs (documents) for
    text / jsonl, (messages, "file:line") for chat. `fmt`: None guesses (finetune_format). A
    command splits the records (e.g. a validation share) before encoding them."""
    fmt = fmt or finetune_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if fmt == "chat":
        return fmt, read_chat_jsonl(path)
    return fmt, corpus.read_records(path, fmt, LM)


def encode_finetune_records(
    records: list, fmt: str, tokenizer, max_len: int, *, template=None, on_long: str = "skip"
) -> Dataset:
    """The LM examples (with tgt_weights) of read_finetune_records' records for a model of
    max_len with `tokenizer` (an HFTokenizer for chat; `template`: its ChatTemplate, read from
    the tokenizer's directory when None); every id checked against tokenizer.vocab_size.
    DataError naming the file and line for bad input."""
    if fmt == "chat":
        if template is None:
            from flax_transformer.hf.chat_template import ChatTemplate, ChatTemplateError

            try:
                template = ChatTemplate.of_tokenizer(tokenizer)
            except ChatTemplateError as err:
                raise DataError(f"{records[0][1]}: {err}") from None
        dataset = encode_chats(records, tokenizer, template, max_len, on_long)
    else:
        dataset = encode_documents(records, tokenizer, max_len)  # (every target weighs 1)
    check_dataset_ids(dataset, tokenizer.vocab_size)
    return dataset


def read_finetune_dataset(
    path: str | Path,
    tokenizer,
    max_len: int,
    *,
    fmt: str | None = None,
    template=None,
    on_long: str = "skip",
) -> Dataset:
    """read_finetune_records and encode_finetune_records in one call: all of `path`'s
    examples."""
    fmt, records = read_finetune_records(path, fmt)
    return encode_finetune_records(
        records, fmt, tokenizer, max_len, template=template, on_long=on_long
    )
