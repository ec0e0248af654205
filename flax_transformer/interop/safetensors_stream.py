"""safetensors files read and written one tensor at a time, so that a checkpoint of N bytes is
converted holding about N bytes (the result) plus one tensor in flight, never a second copy.

`open_safetensors(path)` reads only the header and returns {name: LazyArray}: shape and dtype
known, the data read (`os.pread` into a fresh numpy buffer, no mmap whose touched pages would
count as resident) when the array is asked for. `LazyArray` composes the cheap reshapings a
conversion applies (`.T`, `.astype`, `.reshape`, `split`, `concatenate`) without reading;
`np.asarray(lazy)` reads and applies them. `write_safetensors(path, tensors)` writes the header
first (from shapes and dtypes) and then each tensor's bytes as it is produced, in safetensors'
own layout (8-byte little-endian header length, JSON header padded with spaces to a multiple of
8, tensors by decreasing alignment then name), so safetensors and transformers read it.
numpy only (bfloat16 through ml_dtypes).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.files.atomic_io import atomic_path
from flax_transformer.spec.tree_check import ConversionError

_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_CODES = {name: code for code, name in _DTYPES.items()}
MAX_HEADER = 100_000_000  # safetensors' own limit on the header's length


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class LazyArray:
    """An array known by shape and dtype, produced by `load()` only when asked for
    (`np.asarray`); `.T`, `.transpose()`, `.astype`, `.reshape`, `split` and `concatenate`
    return new LazyArrays that apply themselves after the load."""

    def __init__(
        self, shape: Iterable[int], dtype, load: Callable[[], np.ndarray], owned: bool = False
    ):
        self.shape, self.dtype, self._load = tuple(int(n) for n in shape), np.dtype(dtype), load
        # Whether each load gives a buffer nobody else holds (a file read, a copy): a consumer
        # may keep it as it is instead of copying it.
        self.owned = owned

    @classmethod
    def of(cls, array) -> LazyArray:
        """An array (numpy or JAX) as a LazyArray that converts it with np.asarray when asked."""
        if isinstance(array, LazyArray):
            return array
        return cls(np.shape(array), array.dtype, lambda: np.asarray(array))

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __repr__(self) -> str:
        return f"LazyArray(shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype=None, copy=None):
        array = np.asarray(self._load())
        if array.shape != self.shape or array.dtype != self.dtype:  # a bug, never a file's fault
            raise AssertionError(f"{self!r} loaded as {array.shape} {array.dtype}")
        return array if dtype is None else array.astype(dtype, copy=False)

    def _then(self, shape, dtype, step, owned: bool | None = None) -> LazyArray:
        owned = self.owned if owned is None else owned
        return LazyArray(shape, dtype, lambda: step(np.asarray(self)), owned)

    @property
    def T(self) -> LazyArray:  # noqa: N802 (numpy's name)
        """The transpose (all axes reversed), lazily."""
        return self._then(self.shape[::-1], self.dtype, lambda a: a.T)

    def transpose(self, *axes) -> LazyArray:
        """ndarray.transpose(*axes), lazily (np.transpose(lazy) calls it)."""
        if len(axes) == 1 and not isinstance(axes[0], int):  # transpose((1, 0)), transpose(None)
            axes = () if axes[0] is None else tuple(axes[0])
        order = axes or tuple(range(self.ndim))[::-1]
        return self._then([self.shape[i] for i in order], self.dtype, lambda a: a.transpose(order))

    def astype(self, dtype, copy: bool = False) -> LazyArray:
        """Cast to `dtype` when read (itself when it already is that dtype)."""
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        return self._then(self.shape, dtype, lambda a: a.astype(dtype), owned=True)

    def reshape(self, *shape, order: str = "C") -> LazyArray:
        """ndarray.reshape(*shape) in C order (one -1 allowed), lazily."""
        if order != "C":
            raise NotImplementedError("LazyArray.reshape is C order only")
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
        new = tuple(self.size // max(known, 1) if n == -1 else n for n in shape)
        return self._then(new, self.dtype, lambda a: a.reshape(shape))

    def split(self, parts: int | Sequence[int], axis: int = -1) -> list[LazyArray]:
        """np.split(self, parts, axis) as LazyArrays, each a copy: `parts` equal pieces, or
        pieces of the widths `parts` lists. The source is read once for all of them and dropped
        when the last has been read (read them together)."""
        axis = axis % self.ndim
        widths = [self.shape[axis] // parts] * parts if isinstance(parts, int) else list(parts)
        starts = np.concatenate([[0], np.cumsum(widths)]).astype(int).tolist()
        held: dict[str, Any] = {"array": None, "left": set(range(len(widths)))}

        def piece(i):
            index = (slice(None),) * axis + (slice(starts[i], starts[i + 1]),)
            shape = self.shape[:axis] + (widths[i],) + self.shape[axis + 1 :]

            def load():
                source = held["array"] if held["array"] is not None else np.asarray(self)
                held["left"].discard(i)
                held["array"] = source if held["left"] else None
                return np.array(source[index])

            return LazyArray(shape, self.dtype, load, owned=True)

        return [piece(i) for i in range(len(widths))]

    @staticmethod
    def concatenate(arrays, axis: int = -1) -> LazyArray:
        """np.concatenate(arrays, axis) as a LazyArray (arrays: LazyArrays or arrays)."""
        arrays = [LazyArray.of(a) for a in arrays]
        first = arrays[0]
        axis = axis % first.ndim
        total = sum(a.shape[axis] for a in arrays)
        shape = first.shape[:axis] + (total,) + first.shape[axis + 1 :]
        dtype = np.result_type(*(a.dtype for a in arrays))
        return LazyArray(
            shape, dtype, lambda: np.concatenate([np.asarray(a) for a in arrays], axis), True
        )


# ----------------------------------------------------------------------------- reading
def read_header(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """({name: {"dtype", "shape", "data_offsets"}}, metadata, data start) of a safetensors
    file; ConversionError naming the file for anything that is not one."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a header")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise ValueError(f"header length {length} past the end of the file")
            header = json.loads(handle.read(length).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ConversionError(f"{path}: not a readable safetensors file ({err})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: not a readable safetensors file (header is not an object)")
    metadata = header.pop("__metadata__", None) or {}
    start, data = 8 + length, size - 8 - length
    for name, info in header.items():
        problem = _entry_problem(info, data)
        if problem:
            raise ConversionError(f"{path}: tensor {name!r}: {problem}")
    return header, metadata, start


def _entry_problem(info: Any, data_bytes: int) -> str | None:
    """Why a header entry cannot be read (None: it can)."""
    try:
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
    except (TypeError, KeyError, ValueError):
        return "malformed header entry"
    if dtype not in _DTYPES:
        return f"unsupported safetensors dtype {dtype!r}"
    if not 0 <= begin <= end <= data_bytes:
        return f"data offsets {begin}..{end} outside the file's {data_bytes} data bytes"
    if end - begin != count * _dtype(_DTYPES[dtype]).itemsize:
        return f"{end - begin} bytes for shape {shape} of {dtype}"
    return None


def open_safetensors(path: str | Path) -> tuple[dict[str, LazyArray], dict[str, str]]:
    """({name: LazyArray}, metadata) of a safetensors file: the header is read now, each
    tensor's bytes when it is asked for (bfloat16 as ml_dtypes.bfloat16)."""
    path = Path(path)
    header, metadata, start = read_header(path)
    tensors = {}
    for name, info in header.items():
        dtype = _dtype(_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        read = _reader(path, start + begin, end - begin, dtype, info["shape"])
        tensors[name] = LazyArray(info["shape"], dtype, read, owned=True)
    return tensors, metadata


def _reader(path: Path, offset: int, nbytes: int, dtype: np.dtype, shape) -> Callable:
    def read() -> np.ndarray:
        array = np.empty(shape, dtype)
        view = memoryview(array.reshape(-1).view(np.uint8))
        try:
            with open(path, "rb") as handle:
                done = 0
                while done < nbytes:
                    got = os.preadv(handle.fileno(), [view[done:]], offset + done)
                    if got == 0:
                        raise OSError("the file ends early")
                    done += got
        except OSError as err:
            raise ConversionError(f"{path}: cannot read a tensor ({err})") from None
        return array

    return read


# ----------------------------------------------------------------------------- writing
def write_safetensors(
    path: str | Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> int:
    """Write `tensors` (arrays or LazyArrays: each is produced, written and dropped in turn) as
    a safetensors file; returns the bytes of tensor data written."""
    order = sorted(tensors, key=lambda k: (-_dtype_of(tensors[k]).itemsize, k))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        value = tensors[name]
        dtype = _dtype_of(value)
        if dtype.name not in _CODES:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {dtype}, not storable")
        nbytes = int(np.prod(np.shape(value), dtype=np.int64)) * dtype.itemsize
        header[name] = {
            "dtype": _CODES[dtype.name],
            "shape": list(np.shape(value)),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:  # whole or not at all
        handle.write(struct.pack("<Q", len(text)) + text)
        for name in order:
            array = np.ascontiguousarray(np.asarray(tensors[name]))
            handle.write(memoryview(array.reshape(-1).view(np.uint8)))
            del array
    return offset


def _dtype_of(value) -> np.dtype:
    return np.dtype(value.dtype)
