"""Sharded safetensors checkpoints as transformers writes and reads them.

Reading: `model.safetensors.index.json` ({"metadata": {"total_size": ...}, "weight_map":
{tensor: shard file}}) and its shards, each opened lazily (interop/safetensors_stream.py), the
index checked against the shards first: a missing shard, a tensor the index maps to a shard that
does not hold it, and a tensor a shard holds that the index does not map there are each a
ConversionError naming the file and the tensor.
Writing: `save_pretrained(max_shard_size=...)`'s split (huggingface_hub's: tensors in order, a
new shard when the next tensor would pass the limit, a tensor bigger than the limit alone in its
own shard), one `model.safetensors` when everything fits in one shard, else
`model-00001-of-0000N.safetensors` ... and the index (sorted keys, indent 2, metadata
total_size and total_parameters), each tensor produced and written in turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.interop.safetensors_stream import (
    LazyArray,
    open_safetensors,
    write_safetensors,
)
from flax_transformer.spec.tree_check import ConversionError

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
SHARD_NAME = "model-{index:05d}-of-{count:05d}.safetensors"
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
DEFAULT_MAX_SHARD_SIZE = "50GB"  # transformers 5's save_pretrained default
SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def parse_shard_size(size: int | str) -> int:
    """Bytes of a max_shard_size as save_pretrained takes it: an int, or a number and a unit of
    TB, GB, MB, KB (powers of 10, e.g. "5GB", "1.5GB", "200MB"); ValueError otherwise."""
    if isinstance(size, bool) or not isinstance(size, int | str):
        raise ValueError(f"max_shard_size must be an int or a string like '5GB', got {size!r}")
    if isinstance(size, int):
        value = size
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]B)\s*", size, re.IGNORECASE)
        if not match:
            raise ValueError(
                f"max_shard_size {size!r}: give bytes or a number with a unit of TB, GB, MB or "
                "KB, e.g. '5GB'"
            )
        value = int(float(match[1]) * SIZE_UNITS[match[2].upper()])
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value


def plan_shards(sizes: Mapping[str, int], max_bytes: int) -> list[list[str]]:
    """The tensor names of each shard, in order, as huggingface_hub's split makes them."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, size in sizes.items():
        if size > max_bytes:  # alone, in a shard bigger than the limit
            shards.append([name])
            continue
        if current_size + size > max_bytes:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current:
        shards.append(current)
    return shards


def write_weights(
    directory: Path,
    state: Mapping[str, Any],
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write `state` (arrays or LazyArrays, in the order given) into `directory` as
    model.safetensors, or as shards of at most `max_shard_size` bytes plus the index; returns
    the file the weights are found through (model.safetensors or the index)."""
    max_bytes = parse_shard_size(max_shard_size)
    sizes = {k: _nbytes(v) for k, v in state.items()}
    shards = plan_shards(sizes, max_bytes) or [[]]
    remove_weights(directory)  # no stale shard or index of an earlier save stays beside these
    if len(shards) == 1:
        write_safetensors(directory / SAFETENSORS, state, metadata)
        return directory / SAFETENSORS
    weight_map = {}
    for number, names in enumerate(shards, start=1):
        name = SHARD_NAME.format(index=number, count=len(shards))
        write_safetensors(directory / name, {k: state[k] for k in names}, metadata)
        weight_map.update(dict.fromkeys(names, name))
    total_parameters = sum(int(np.prod(np.shape(v), dtype=np.int64)) for v in state.values())
    index = {
        "metadata": {"total_parameters": total_parameters, "total_size": sum(sizes.values())},
        "weight_map": weight_map,
    }
    atomic_write_text(
        directory / SAFETENSORS_INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n"
    )
    return directory / SAFETENSORS_INDEX


def remove_weights(directory: Path) -> None:
    """Delete the safetensors weights (single file, index, shards) a directory holds."""
    for path in directory.glob("model*.safetensors*"):
        if path.name in (SAFETENSORS, SAFETENSORS_INDEX) or SHARD_PATTERN.fullmatch(path.name):
            path.unlink()


def _nbytes(value) -> int:
    return int(np.prod(np.shape(value), dtype=np.int64)) * np.dtype(value.dtype).itemsize


def read_index(index_path: Path) -> dict[str, str]:
    """{tensor: shard file name} of a safetensors index; ConversionError naming the index for
    one that is not JSON, has no weight_map, or maps a tensor to a name outside its directory."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConversionError(f"{index_path}: cannot read the safetensors index ({err})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(
            f"{index_path}: not a safetensors index (no weight_map of tensor -> shard file)"
        )
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise ConversionError(
                f"{index_path}: tensor {tensor!r} is mapped to {shard!r}, not a file name in "
                "the index's directory"
            )
    return weight_map


def open_sharded(index_path: Path) -> dict[str, LazyArray]:
    """{tensor: LazyArray} of a sharded checkpoint (nothing read but the headers), checked
    against its index: one ConversionError naming the first problem's file and tensor."""
    weight_map = read_index(index_path)
    directory = index_path.parent
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    state: dict[str, LazyArray] = {}
    problems = []
    for shard, named in by_shard.items():
        if not (directory / shard).is_file():
            problems.append(
                f"{directory / shard}: missing (the index maps {len(named)} tensor(s) to it, "
                f"e.g. {named[0]!r})"
            )
            continue
        tensors, _ = open_safetensors(directory / shard)
        for tensor in named:
            if tensor not in tensors:
                problems.append(
                    f"{directory / shard}: does not hold tensor {tensor!r}, which the index "
                    "maps to it"
                )
        for tensor, array in tensors.items():
            if weight_map.get(tensor) == shard:
                state[tensor] = array
            elif tensor in weight_map:
                problems.append(
                    f"{directory / shard}: holds tensor {tensor!r}, which the index maps to "
                    f"{weight_map[tensor]}"
                )
            else:
                problems.append(
                    f"{directory / shard}: holds tensor {tensor!r}, which the index does not name"
                )
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConversionError(f"{index_path}: bad sharded checkpoint: {problems[0]}{more}")
    return state
