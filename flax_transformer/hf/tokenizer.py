"""A transformers tokenizer (e.g. an imported Marian model's) behind this project's tokenizer
interface (pad_id, bos_id, eos_id, vocab_size, encode, decode, token_strings, save), so that
train.py, the generate CLI and evaluation use it like the byte and BPE tokenizers.

Saved as a small tokenizer.json description pointing at the transformers files, which sit in
`hf_tokenizer/` beside it. `bos_id` is the decoder's first token (transformers'
decoder_start_token_id for a seq2seq model; Marian: its pad id) or an LM's begin-of-text token.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path

from flax_transformer.files.atomic_io import atomic_write_text

HF_TOKENIZER_TYPE = "hf_pretrained"
HF_TOKENIZER_DIR = "hf_tokenizer"

# (category, message) of the warnings tokenizer loading has shown in this process.
_SHOWN_WARNINGS: set[tuple[type, str]] = set()


def load_pretrained_tokenizer(directory: str | Path):
    """transformers' AutoTokenizer.from_pretrained(directory), each of its warnings shown once
    per process. A process loads one tokenizer several times (an import, then the run it
    wrote; train.py --init-from, then its own run), and MarianTokenizer warns "Recommended: pip
    install sacremoses." at every load; Python's once-per-place rule does not hold it back,
    since any warnings.catch_warnings in between (JAX, Orbax, transformers use them) resets it."""
    from transformers import AutoTokenizer

    check_tokenizer_json(directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    for warning in caught:
        key = (warning.category, str(warning.message))
        if key not in _SHOWN_WARNINGS:
            _SHOWN_WARNINGS.add(key)
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    return tokenizer


# The JSON files a transformers tokenizer directory may hold; transformers' own error for a
# damaged one names no file.
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def check_tokenizer_json(directory: str | Path) -> None:
    """A ValueError naming the first tokenizer JSON file in `directory` that is not JSON (its
    line and column), before transformers reads it."""
    for name in TOKENIZER_JSON_FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        try:
            json.loads(path.read_bytes())
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
            ) from None


class HFTokenizer:
    """A transformers tokenizer with this project's tokenizer interface; pad/bos/eos ids and
    vocab_size are the model's."""

    kind = "hf"

    def __init__(
        self, tokenizer, *, pad_id: int, bos_id: int, eos_id: int, vocab_size: int,
        directory: Path | None = None,
    ):  # fmt: skip
        self._tok = tokenizer
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.vocab_size = vocab_size  # the model's (a tokenizer may know fewer ids)
        self.directory = directory  # the transformers files (chat_template.py reads them)

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named special tokens as strings ({"bos_token": ..., "eos_token": ...}): what
        transformers puts in a chat template's context (`special_tokens_map`)."""
        return dict(self._tok.special_tokens_map)

    def encode(self, text: str) -> list[int]:
        """Token ids without special tokens (the callers add bos / eos where they belong)."""
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`encode(text)` and each token's (start, end) characters in `text` (a fast
        tokenizer's offsets, as apply_chat_template's assistant mask reads them)."""
        out = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(pair) for pair in out["offset_mapping"]]

    def encode_input(self, text: str) -> list[int]:
        """The ids a model reads for `text` on its own, with the tokenizer's special tokens
        ([CLS] text [SEP] for BERT, <s> text </s> for RoBERTa): what `tokenizer(text)` gives,
        the input of a sequence classifier."""
        return list(self._tok(text)["input_ids"])

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text, special tokens skipped."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """Each id's token as the tokenizer spells it (subword pieces, not decoded text)."""
        return [str(t) for t in self._tok.convert_ids_to_tokens([int(i) for i in ids])]

    def save(self, path: str | Path) -> None:
        """tokenizer.json (this description) at `path`, the transformers files beside it."""
        path = Path(path)
        self._tok.save_pretrained(str(path.parent / HF_TOKENIZER_DIR))
        description = {
            "type": HF_TOKENIZER_TYPE,
            "directory": HF_TOKENIZER_DIR,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "vocab_size": self.vocab_size,
        }
        atomic_write_text(path, json.dumps(description, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, description: dict) -> HFTokenizer:
        """The tokenizer a tokenizer.json `description` points at (its hf_tokenizer/ directory
        beside `path`); ValueError if transformers is missing, the files cannot be loaded or an
        id is missing."""
        directory = Path(path).parent / description.get("directory", HF_TOKENIZER_DIR)
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise ValueError(
                f"{path}: this run's tokenizer is a transformers tokenizer; install transformers"
            ) from None
        try:
            tokenizer = load_pretrained_tokenizer(directory)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{directory}: cannot load the transformers tokenizer ({err})"
            ) from None
        ids = {name: description.get(name) for name in ("pad_id", "bos_id", "eos_id", "vocab_size")}
        missing = [name for name, value in ids.items() if not isinstance(value, int)]
        if missing:
            raise ValueError(f"{path}: missing or non-integer {', '.join(missing)}")
        return cls(tokenizer, **ids, directory=directory)
