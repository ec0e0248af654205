"""What this machine offers the kernels, read without JAX: the operating system and processor
architecture, and the CPU's flags (/proc/cpuinfo)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# The vector extensions `ftx info` lists (those a kernel or XLA:CPU's code cares about), in order.
VECTOR_EXTENSIONS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        return set(_proc_flags())
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


@functools.cache
def _proc_flags() -> frozenset[str]:
    """This machine's flags, read once (a kernel's choice is asked at every product traced)."""
    try:
        return frozenset(cpu_flags(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return frozenset()


def cpu_model() -> str:
    """The processor's name ("model name" in /proc/cpuinfo), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vector_extensions() -> list[str]:
    """The VECTOR_EXTENSIONS this CPU has, in that order."""
    flags = cpu_flags()
    return [name for name in VECTOR_EXTENSIONS if name in flags]


def platform_problem() -> str | None:
    """None on Linux x86-64 (where the kernels are built), else why the kernels cannot run."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the kernels need Linux on x86-64, this is {platform.system()} {platform.machine()}"
    return None


def missing_flags(needed: tuple[str, ...]) -> str | None:
    """None when the CPU has every flag in `needed`, else "this CPU lacks ..."."""
    missing = set(needed) - cpu_flags()
    return f"this CPU lacks {' and '.join(sorted(missing))}" if missing else None
