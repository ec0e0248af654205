"""Chat fine-tuning data: JSONL conversations, one a line,

    {"messages": [{"role": "system" | "user" | "assistant" | "tool", "content": "..."}, ...]}

rendered with the run's chat template (hf/chat_template.py) into the ids the model reads, with a
loss weight per target token: 1 on the assistant replies (the template's spans: its
{% generation %} blocks, else found by rendering prefixes; a reply's end-of-turn token is
inside its span), 0 on everything else, so a fine-tune learns to answer, not to write the
user's turns. A message may carry other keys (e.g. reasoning_content); the template sees them.

Bad input is a DataError naming the file and line: not JSON, no "messages" list, a message
without a string role or content, an unknown role, no assistant reply, a template that fails
on the conversation or renders no reply tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flax_transformer.data import corpus
from flax_transformer.data.pipeline import (
    LONG_POLICIES,
    DataError,
    Dataset,
    Pair,
    warn_long_pairs,
)
from flax_transformer.hf.chat_template import ChatTemplateError, tokens_in_spans

ROLES = ("system", "user", "assistant", "tool")
WHAT = "chat JSONL file"


def chat_messages(path, number: int, line: str) -> list[dict] | None:
    """One JSONL line as its list of messages (None for a blank line), checked (see the module
    docstring); DataError naming the file and line."""
    if not line.strip():
        return None
    where = f"{WHAT} {path} line {number}"
    record = corpus.json_record(line, where)
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise DataError(f'{where}: expected an object with a non-empty "messages" list')
    for index, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            raise DataError(f"{where}: message {index} is not an object")
        for field in ("role", "content"):
            if not isinstance(message.get(field), str):
                raise DataError(f'{where}: message {index} has no string "{field}"')
        if message["role"] not in ROLES:
            raise DataError(
                f"{where}: message {index} has the unknown role {message['role']!r} "
                f"(known: {', '.join(ROLES)})"
            )
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise DataError(f"{where}: no assistant reply: there is nothing to learn from it")
    return messages


def read_chat_jsonl(path: str | Path) -> list[tuple[list[dict], str]]:
    """Every conversation of a chat JSONL file with where it is ("file:line"); DataError for a
    bad line or a file without conversations."""
    chats = []
    for number, raw in enumerate(corpus.raw_lines(path, "jsonl"), start=1):
        messages = chat_messages(path, number, corpus.decode("jsonl", path, number, raw))
        if messages is not None:
            chats.append((messages, f"{path}:{number}"))
    if not chats:
        raise DataError(f"{WHAT} {path}: no conversations found")
    return chats


def encode_chats(chats, tokenizer, template, max_len: int, on_long: str = "skip") -> Dataset:
    """LM examples of `chats` ([(messages, where)]): the template's ids shifted as an LM's
    (tgt_in = ids[:-1], tgt_out = ids[1:]) and tgt_weights = the assistant mask of tgt_out.
    A conversation over max_len + 1 ids is skipped (warned once), truncated (its replies past
    the cut weigh nothing) or an error, by `on_long`."""
    if on_long not in LONG_POLICIES:
        raise ValueError(f"on_long must be one of {LONG_POLICIES}, got {on_long!r}")
    tgt_in, tgt_out, weights, kept, long = [], [], [], [], []
    for messages, where in chats:
        try:
            text, spans = template.assistant_spans(messages)
        except ChatTemplateError as err:
            raise DataError(f"{where}: {err}") from None
        ids, offsets = tokenizer.encode_with_offsets(text)
        mask = tokens_in_spans(offsets, spans)
        if not any(mask):
            raise DataError(f"{where}: the chat template renders no assistant reply tokens")
        if len(ids) > max_len + 1:
            long.append(where)
            if on_long == "error":
                raise DataError(
                    f"{where}: a conversation of {len(ids)} tokens does not fit max_len "
                    f"{max_len} (+1: the targets are shifted); raise --max-len or pass "
                    "--on-long skip|truncate"
                )
            if on_long == "skip":
                continue
            ids, mask = ids[: max_len + 1], mask[: max_len + 1]
        tgt_in.append(np.array(ids[:-1], np.int32))
        tgt_out.append(np.array(ids[1:], np.int32))
        weights.append(np.array(mask[1:], np.float32))
        kept.append(Pair("", text, where))
    if long:
        warn_long_pairs(len(long), long, max_len, on_long, stacklevel=3)
    if not kept:  # (the model's max_len: an --init-from run's, which no flag changes)
        files = ", ".join(dict.fromkeys(w.rsplit(":", 1)[0] for _, w in chats))
        raise DataError(
            f"{WHAT} {files}: no conversation fits the model's max_len {max_len} (all "
            f"{len(chats)} are longer); pass --on-long truncate to keep their beginnings"
        )
    return Dataset(tgt_in, tgt_out, None, kept, weights)
