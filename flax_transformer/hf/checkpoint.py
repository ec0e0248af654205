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

import numpy as np

from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.files.modes import give_umask_mode
from flax_transformer.interop.convert import load_safetensors, load_torch_pickle
from flax_transformer.spec.tree_check import ConversionError

SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)
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


@dataclasses.dataclass
class HFCheckpoint:
    """A save_pretrained directory as read: config.json, the weights by HF key,
    generation_config.json and the weights file they came from."""

    hf_config: dict[str, Any]
    state: dict[str, np.ndarray]  # HF key -> array, as stored
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


def read_weights(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """(the file read, HF key -> array) from model.safetensors, a sharded safetensors index or
    pytorch_model.bin, in that order; ConversionError if the directory has none."""
    if (path / SAFETENSORS).exists():
        return path / SAFETENSORS, load_safetensors(path / SAFETENSORS)[0]
    if (path / SAFETENSORS_INDEX).exists():
        index = read_json(path / SAFETENSORS_INDEX, "safetensors index")
        state: dict[str, np.ndarray] = {}
        for shard in sorted(set(index.get("weight_map", {}).values())):
            state.update(load_safetensors(path / shard)[0])
        return path / SAFETENSORS_INDEX, state
    if (path / TORCH_BIN).exists():
        return path / TORCH_BIN, load_torch_pickle(path / TORCH_BIN)
    raise ConversionError(
        f"{path}: no weights (expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {TORCH_BIN})"
    )


def write_hf_dir(
    path: str | Path,
    hf_config: dict[str, Any],
    state: dict[str, np.ndarray],
    generation_config: dict[str, Any],
    tokenizer_from: Path | None = None,
) -> Path:
    """Write config.json, model.safetensors (metadata format "pt", as transformers writes it),
    generation_config.json (when not empty) and the tokenizer files found in `tokenizer_from`."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / "config.json", json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    tensors = {k: np.ascontiguousarray(v) for k, v in state.items()}
    save_file(tensors, str(path / SAFETENSORS), metadata={"format": "pt"})
    give_umask_mode(path / SAFETENSORS)  # safetensors writes 0600 whatever the umask
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
    for name in TOKENIZER_FILES:
        if (Path(source) / name).exists():
            shutil.copyfile(Path(source) / name, Path(destination) / name)
            copied.append(name)
    return copied


def has_tokenizer(path: Path) -> bool:
    """Whether the directory holds any of the files a transformers tokenizer is saved as."""
    return any((Path(path) / name).exists() for name in TOKENIZER_FILES)
