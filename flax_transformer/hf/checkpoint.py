"""A directory written by transformers' `save_pretrained`, read and written with numpy and
safetensors only (torch only for a legacy `pytorch_model.bin`, loaded with weights_only=True).

Files: config.json, the weights (model.safetensors, a sharded model.safetensors.index.json, or
pytorch_model.bin), generation_config.json (optional), tokenizer files (copied as they are).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.hf.shards import (
    DEFAULT_MAX_SHARD_SIZE,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    open_sharded,
    write_weights,
)
from flax_transformer.interop.convert import load_torch_pickle
from flax_transformer.interop.safetensors_stream import open_safetensors
from flax_transformer.spec.tree_check import ConversionError

TORCH_BIN = "pytorch_model.bin"
# Files a transformers tokenizer may be saved as (any subset).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "source.spm",
    "target.spm",
    "sentencepiece.bpe.model",
    "spiece.model",
)
# A tokenizer's chat template, beside its files (transformers 5 writes chat_template.jinja):
# copied with them, so that an export of a chat fine-tune keeps it; not a tokenizer alone.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


@dataclasses.dataclass
class HFCheckpoint:
    """A save_pretrained directory as read: config.json, the weights by HF key,
    generation_config.json and the weights file they came from."""

    hf_config: dict[str, Any]
    state: dict[str, Any]  # HF key -> array as stored (LazyArray: read when asked for)
    generation_config: dict[str, Any]  # {} when there is no generation_config.json
    weights_path: Path  # the file (or index) the weights came from


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file; ValueError naming `path` and `what` it should hold if it is
    unreadable, not JSON or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read the {what} ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the {what} must be a JSON object")
    return data


def read_hf_dir(path: str | Path) -> HFCheckpoint:
    """config, weights and generation config of a save_pretrained directory."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory (expected one written by save_pretrained)")
    if not (path / "config.json").exists():
        raise ValueError(f"{path}: no config.json (expected a save_pretrained directory)")
    hf_config = read_json(path / "config.json", "model config")
    generation = path / "generation_config.json"
    generation_config = read_json(generation, "generation config") if generation.exists() else {}
    weights_path, state = read_weights(path)
    return HFCheckpoint(hf_config, state, generation_config, weights_path)


def read_weights(path: Path) -> tuple[Path, dict[str, Any]]:
    """(the file read, HF key -> array) from model.safetensors, a sharded safetensors index or
    pytorch_model.bin, in that order; ConversionError if the directory has none. safetensors
    tensors are LazyArrays (only the headers are read here; each tensor when it is converted)."""
    if (path / SAFETENSORS).exists():
        return path / SAFETENSORS, open_safetensors(path / SAFETENSORS)[0]
    if (path / SAFETENSORS_INDEX).exists():
        return path / SAFETENSORS_INDEX, open_sharded(path / SAFETENSORS_INDEX)
    if (path / TORCH_BIN).exists():
        return path / TORCH_BIN, load_torch_pickle(path / TORCH_BIN)
    raise ConversionError(
        f"{path}: no weights (expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {TORCH_BIN})"
    )


def write_hf_dir(
    path: str | Path,
    hf_config: dict[str, Any],
    state: dict[str, Any],
    generation_config: dict[str, Any],
    tokenizer_from: Path | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write config.json, the weights (metadata format "pt", as transformers writes them):
    model.safetensors, or shards of at most `max_shard_size` and their index (hf/shards.py),
    each tensor of `state` (arrays or LazyArrays) produced and written in turn,
    generation_config.json (when not empty) and the tokenizer files found in `tokenizer_from`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    write_weights(path, state, max_shard_size, metadata={"format": "pt"})
    if generation_config:
        text = json.dumps(generation_config, indent=2, sort_keys=True) + "\n"
        atomic_write_text(path / "generation_config.json", text)
    if tokenizer_from is not None:
        copy_tokenizer_files(tokenizer_from, path)
    return path


def copy_tokenizer_files(source: Path, destination: Path) -> list[str]:
    """Copy whichever tokenizer files `source` has; returns their names."""
    copied = []
    if Path(source).resolve() == Path(destination).resolve():
        return copied
    for name in TOKENIZER_FILES + CHAT_TEMPLATE_FILES:
        if (Path(source) / name).exists():
            shutil.copyfile(Path(source) / name, Path(destination) / name)
            copied.append(name)
    return copied


def has_tokenizer(path: Path) -> bool:
    """Whether the directory holds any of the files a transformers tokenizer is saved as."""
    return any((Path(path) / name).exists() for name in TOKENIZER_FILES)
