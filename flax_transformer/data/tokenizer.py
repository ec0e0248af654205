"""Tokenizers: byte-level UTF-8 (the default, any language) and subword BPE (HF `tokenizers`).

Both reserve the same special ids: pad=0, bos=1, eos=2. `decode` drops them. Saved as one JSON
file: the byte tokenizer as a tiny description, BPE as the HF `tokenizer.json` itself (so HF tools
read it too); `load_tokenizer` tells them apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from flax_transformer.files.atomic_io import atomic_write_text

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2 in both tokenizers
BYTE_TOKENIZER_TYPE = "byte_utf8"
# Byte-level BPE starts from the 256 byte symbols and the specials; a smaller vocabulary cannot
# be trained (HF `tokenizers` would silently return this size instead).
BPE_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


class ByteTokenizer:
    """UTF-8 bytes shifted past the specials: byte b -> id b + 3; vocab_size 259."""

    pad_id, bos_id, eos_id = 0, 1, 2
    offset = len(SPECIAL_TOKENS)
    vocab_size = 256 + offset
    kind = "byte"

    def encode(self, text: str) -> list[int]:
        """Text -> its UTF-8 bytes shifted past the specials (byte b -> id b + 3); no BOS / EOS."""
        return [b + self.offset for b in text.encode("utf-8")]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text."""
        return [[b + self.offset for b in text.encode("utf-8")] for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Specials dropped; a byte sequence cut inside a character decodes to U+FFFD."""
        data = bytes(int(i) - self.offset for i in ids if self.offset <= int(i) < self.vocab_size)
        return data.decode("utf-8", errors="replace")

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One printable label per id (for attention plots)."""
        labels = []
        for i in ids:
            i = int(i)
            if i < self.offset:
                labels.append(SPECIAL_TOKENS[i])
            else:
                char = bytes([i - self.offset]).decode("utf-8", errors="replace")
                labels.append(char if char.isprintable() else f"\\x{i - self.offset:02x}")
        return labels

    def save(self, path: str | Path) -> None:
        """Write the tokenizer's description (type and special tokens) to `path`, atomically."""
        atomic_write_text(
            path, json.dumps({"type": BYTE_TOKENIZER_TYPE, "specials": SPECIAL_TOKENS})
        )


class BPETokenizer:
    """Byte-level BPE trained with HF `tokenizers`: no unknown tokens, any UTF-8 text."""

    pad_id, bos_id, eos_id = 0, 1, 2
    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer
        for expected_id, token in enumerate(SPECIAL_TOKENS):
            if hf_tokenizer.token_to_id(token) != expected_id:
                raise ValueError(f"BPE tokenizer must map {token} to id {expected_id}")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000) -> BPETokenizer:
        """Train a byte-level BPE on `texts` with `vocab_size` entries (specials at ids 0, 1, 2);
        ValueError if vocab_size is not an int or below 259."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise ValueError(f"BPE vocab_size must be an int, got {vocab_size!r}")
        if vocab_size < BPE_MIN_VOCAB:
            raise ValueError(
                f"BPE vocab_size {vocab_size} is below {BPE_MIN_VOCAB}, the 256 byte symbols "
                "and 3 special tokens every byte-level BPE vocabulary holds"
            )

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        """The number of ids, specials included."""
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Text -> token ids, without special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, by the library's multi-threaded batch encoding."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text, special tokens skipped."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Each id's text on its own (its token name when that decodes to nothing, "?" when
        unknown)."""
        return [self.decode([i]) or (self._tok.id_to_token(int(i)) or "?") for i in ids]

    def save(self, path: str | Path) -> None:
        """Write the trained tokenizer as HF tokenizers JSON to `path`, atomically."""
        atomic_write_text(path, self._tok.to_str())


TOKENIZERS = {cls.kind: cls for cls in (ByteTokenizer, BPETokenizer)}  # train.py --tokenizer


def load_tokenizer(path: str | Path) -> ByteTokenizer | BPETokenizer:
    """Read a tokenizer saved by either class's `save`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read tokenizer file {path}: {err}") from None
    if isinstance(data, dict) and data.get("type") == BYTE_TOKENIZER_TYPE:
        return ByteTokenizer()
    if isinstance(data, dict) and data.get("type") == "hf_pretrained":  # an imported model's
        from flax_transformer.hf.tokenizer import HFTokenizer

        return HFTokenizer.load(path, data)
    if isinstance(data, dict) and "model" in data:
        from tokenizers import Tokenizer

        try:
            return BPETokenizer(Tokenizer.from_str(text))
        except Exception as err:  # the tokenizers library raises a bare Exception
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"{path}: not a valid tokenizer file ({first}); damaged?") from None
    raise ValueError(f"{path}: not a tokenizer file written by this project")


def run_tokenizer(saved: str | Path | None, kind: str, texts, bpe_vocab_size: int):
    """A training run's tokenizer: the tokenizer file `saved` (the run's own, or its
    --init-from run's) when given, else a new one of `kind`: a BPE of `bpe_vocab_size` trained
    on `texts()` (a bounded sample of the corpus), or bytes."""
    if saved is not None:
        return load_tokenizer(saved)
    if kind == BPETokenizer.kind:
        return BPETokenizer.train(texts(), vocab_size=bpe_vocab_size)
    return ByteTokenizer()
