"""Keep glibc from handing XLA:CPU fresh pages on every training step.

XLA:CPU allocates one step's temporaries (the activations kept for the backward pass: 626 MiB
for the benchmark's d_model 512 3+3 model) as one block with malloc, from its own threads, and
frees it when the step ends. glibc serves a block that large with mmap and gives it back with
munmap, so every step faults in and zeroes the whole block again: 164,000 page faults and about
0.35 s of kernel time per step for that model on a 2-core CPU (bench/NOTES.md, "Page faults").
Four glibc tunables keep the block mapped from one step to the next:

- `glibc.malloc.arena_max=1`: XLA's threads allocate from the main heap (other arenas would
  still mmap a block larger than their 64 MiB heaps);
- `glibc.malloc.mmap_max=0`: large blocks come from the heap, not from mmap;
- `glibc.malloc.trim_threshold`: the heap's free top is kept, not returned to the kernel;
- `glibc.malloc.hugetlb=1`: the heap is backed by transparent huge pages where the kernel
  allows them (fewer TLB misses in the products; alone it saves nothing).

The cost: the process keeps its peak heap until it exits, as PyTorch's caching allocators do.

glibc reads tunables once, when the process starts, so a training command applies them by
re-executing itself (same interpreter, same arguments, same process id) with GLIBC_TUNABLES
set, before it imports JAX. Tunables the user set keep the user's values. Set
FLAX_TRANSFORMER_MALLOC=system to leave malloc alone. Nothing changes off Linux/glibc, or where
a JAX accelerator plugin is installed and JAX_PLATFORMS does not ask for the CPU (the step's
temporaries live on the device there).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata

TUNABLES: dict[str, str] = {
    "glibc.malloc.arena_max": "1",
    "glibc.malloc.mmap_max": "0",
    "glibc.malloc.trim_threshold": str(2**32 - 1),
    "glibc.malloc.hugetlb": "1",
}
OPT_OUT = "FLAX_TRANSFORMER_MALLOC"  # = "system": leave malloc as it is


def parse_tunables(value: str) -> dict[str, str]:
    """GLIBC_TUNABLES ("name=value:name=value") as a dict, in order; malformed parts dropped
    (glibc ignores them too)."""
    pairs = (part.split("=", 1) for part in value.split(":") if "=" in part)
    return {name: setting for name, setting in pairs if name}


def accelerator_plugin_installed() -> bool:
    """A JAX plugin (CUDA, ROCm, TPU, ...) registered through the `jax_plugins` entry points,
    or the TPU runtime: JAX would pick that device before the CPU."""
    if list(metadata.entry_points(group="jax_plugins")):
        return True
    try:
        metadata.distribution("libtpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def tuned_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-execute with, or None when nothing should change: opted out, not
    Linux with glibc, training that will run on an accelerator, or every tunable already set
    (by the user, or by an earlier re-execution: this is what stops a loop)."""
    if environ.get(OPT_OUT, "").strip().lower() == "system":
        return None
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if not platforms.startswith("cpu") and accelerator_plugin_installed():
        return None
    current = parse_tunables(environ.get("GLIBC_TUNABLES", ""))
    if all(name in current for name in TUNABLES):
        return None
    merged = {**TUNABLES, **current}  # the user's settings win
    value = ":".join(f"{name}={setting}" for name, setting in merged.items())
    return {**environ, "GLIBC_TUNABLES": value}


def reexec_with_tuned_malloc() -> None:
    """Replace this process by the same command with the tunables set; return (changing
    nothing) where tuned_environment says so. Call it first thing in a command's entry point,
    before JAX is imported and before anything is printed."""
    environ = tuned_environment(os.environ)
    if environ is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
