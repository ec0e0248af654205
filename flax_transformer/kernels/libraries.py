"""The native libraries of the package: each one C++ source in this room compiled with its
flags (a source can give several libraries: f32_packed.cc is built for AVX-512 and for AVX2),
the CPU flags it needs, and the XLA FFI targets it registers. Plain data, no JAX."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
HEADERS = ("native_pool.h",)  # included by every kernel: part of each library's key
COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-w")


@dataclass(frozen=True)
class Library:
    """One shared library: `name` (the cache entry's stem), its `source` in this room, the
    compiler `flags`, the `cpu` flags it needs to run, `symbols` (FFI target name -> the
    handler it exports) and `init` (an exported `int f()` run once after loading, 0 = ok)."""

    name: str
    source: str
    flags: tuple[str, ...]
    cpu: tuple[str, ...]
    symbols: dict[str, str] = field(hash=False)
    init: str | None = None

    @property
    def source_path(self) -> Path:
        """The C++ source in this room."""
        return HERE / self.source


def f32_target(build: str) -> str:
    """The FFI target name of a build of f32_packed.cc ("avx512", "avx2")."""
    return f"flax_transformer_f32_packed_product_{build}"


INT8_AMX_TARGET = "flax_transformer_int8_amx_product"
INT8_AVX2_TARGET = "flax_transformer_int8_avx2_product"
BEAM_REORDER_TARGET = "flax_transformer_beam_reorder"

LIBRARIES: dict[str, Library] = {
    lib.name: lib
    for lib in (
        Library(
            "int8_amx", "int8_amx.cc", COMMON_FLAGS + ("-mamx-tile", "-mamx-int8"),
            ("amx_tile", "amx_int8"), {INT8_AMX_TARGET: "int8_amx_product"},
            init="int8_amx_request_permission",
        ),
        Library(
            "int8_avx2", "int8_avx2.cc", COMMON_FLAGS + ("-mavx2",), ("avx2",),
            {INT8_AVX2_TARGET: "int8_avx2_product"},
        ),
        Library(
            "f32_packed_avx512", "f32_packed.cc", COMMON_FLAGS + ("-mavx512f", "-mfma"),
            ("avx512f",), {f32_target("avx512"): "f32_packed_product"},
        ),
        Library(
            "f32_packed_avx2", "f32_packed.cc",
            COMMON_FLAGS + ("-mavx2", "-mfma", "-DF32_PACKED_AVX2"),
            ("avx2", "fma"), {f32_target("avx2"): "f32_packed_product"},
        ),
        Library(
            "beam_reorder", "beam_reorder.cc", COMMON_FLAGS, (),
            {BEAM_REORDER_TARGET: "beam_reorder"},
        ),
    )
}  # fmt: skip
