"""The training command's chat input: a --train-jsonl of conversations (`{"messages": [...]}`,
one a line; data/chat.py) for a decoder LLM fine-tuned from an --init-from run (an `ftx hf
import` of a Llama, Mistral, Qwen, Gemma, Phi-3, ... checkpoint whose tokenizer carries a
chat template).

`ChatInput` answers what runs/train.py asks of a corpus input (kind, read, datasets, install,
discard). Each conversation is rendered with the run tokenizer's chat template into the ids the
model reads, with a loss weight of 1 on the assistant replies (the template's spans, a reply's
end-of-turn token included) and 0 on the rest: the fine-tune learns to answer, not to write the
user's turns. The files are read into memory (fine-tuning sets are small); documents, {"text"}
JSONL and plain text, go through the token cache (runs/train_data.py).
"""

from __future__ import annotations

from pathlib import Path

from flax_transformer.data.chat import read_chat_jsonl
from flax_transformer.data.corpus import held_out_indices
from flax_transformer.data.finetune import encode_finetune_records
from flax_transformer.data.pipeline import DataError
from flax_transformer.runs.spec import UsageError
from flax_transformer.spec.kinds import LM


class ChatInput:
    """One chat fine-tune's conversations: the training file's, and the validation file's or a
    held-out share of the training file's."""

    kind = LM

    def __init__(self, spec):
        self.spec = spec
        self.train_chats: list = []
        self.valid_chats: list | None = None

    def read(self, scan: bool) -> None:
        """Read the conversations (into memory; read, like every input, here and not when the
        input is made); hold out a seeded share for validation when no --valid-jsonl is given
        (the same records on --resume: the same seed)."""
        spec = self.spec
        self.train_chats = read_chat_jsonl(spec.train_jsonl)
        self.valid_chats = read_chat_jsonl(spec.valid_jsonl) if spec.valid_jsonl else None
        if self.valid_chats is not None:
            return
        if len(self.train_chats) < 2:
            raise UsageError(
                "need at least 2 training conversations to hold some out for validation; "
                "pass --valid-jsonl"
            )
        held = set(held_out_indices(len(self.train_chats), self.spec.seed).tolist())
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
                f"chat JSONL file {self.spec.train_jsonl}: {err}; a chat fine-tune renders "
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
