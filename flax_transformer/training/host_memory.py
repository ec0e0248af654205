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
  allows them (alone it saves nothing; with the reuse above it is worth about 5%, likely
  fewer TLB misses in the products: not measured).

The cost: the process keeps its peak heap until it exits, and every malloc of the process
(and of the child processes, which inherit GLIBC_TUNABLES) shares one lock: measured on 2 cores
only (bench/NOTES.md).

glibc reads tunables once, when the process starts, so a training command applies them by
re-executing itself (same interpreter, same arguments, same process id) with GLIBC_TUNABLES
set, before it imports JAX; only when it is the process's own program (not under a debugger,
IPython's %run, runpy or a script read from stdin). Tunables the user set, in GLIBC_TUNABLES or
as MALLOC_* variables, keep the user's values. Set FLAX_TRANSFORMER_MALLOC=system to leave
malloc alone. Nothing changes off Linux/glibc, or where any JAX plugin is installed (CUDA, ROCm,
TPU, ...) and JAX_PLATFORMS does not ask for the CPU: the step's temporaries live on the device
there.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import platform
import signal
import sys
from collections.abc import Mapping
from importlib import metadata

TUNABLES: dict[str, str] = {
    "glibc.malloc.arena_max": "1",
    "glibc.malloc.mmap_max": "0",
    "glibc.malloc.trim_threshold": str(2**32 - 1),
    "glibc.malloc.hugetlb": "1",
}
# The older environment variables for the same settings: where the user set one, theirs holds.
MALLOC_VARIABLES = {
    "glibc.malloc.arena_max": "MALLOC_ARENA_MAX",
    "glibc.malloc.mmap_max": "MALLOC_MMAP_MAX_",
    "glibc.malloc.trim_threshold": "MALLOC_TRIM_THRESHOLD_",
}
OPT_OUT = "FLAX_TRANSFORMER_MALLOC"  # = "system": leave malloc as it is
# Set in the re-executed process: never twice, even where the loader drops GLIBC_TUNABLES
# (setuid interpreters).
DONE = "FLAX_TRANSFORMER_MALLOC_REEXECUTED"
# Modules whose presence means this is not a plain `python train.py`: re-executing would
# restart the host (a notebook kernel, a debugger) instead of the training command.
HOSTS = ("IPython", "ipykernel", "pydevd", "debugpy", "bdb")  # bdb: pdb and its kin


def parse_tunables(value: str) -> dict[str, str]:
    """GLIBC_TUNABLES ("name=value:name=value") as a dict, in order; malformed parts dropped
    (glibc ignores them too)."""
    pairs = (part.split("=", 1) for part in value.split(":") if "=" in part)
    return {name: setting for name, setting in pairs if name}


def accelerator_plugin_installed(environ: Mapping[str, str]) -> bool:
    """Any JAX plugin, found the ways JAX finds them (a `jax_plugins.*` module, a `jax_plugins`
    entry point, PJRT_NAMES_AND_LIBRARY_PATHS), or the TPU runtime: JAX would pick that device
    before the CPU. Conservative: a CPU-only plugin counts too (JAX_PLATFORMS=cpu overrides)."""
    if environ.get("PJRT_NAMES_AND_LIBRARY_PATHS") or environ.get("TPU_LIBRARY_PATH"):
        return True
    if importlib.util.find_spec("libtpu") is not None:
        return True
    namespace = importlib.util.find_spec("jax_plugins")
    if namespace is not None and namespace.submodule_search_locations:
        if any(pkgutil.iter_modules(namespace.submodule_search_locations)):
            return True
    return bool(list(metadata.entry_points(group="jax_plugins")))


def tuned_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-execute with, or None when nothing should change: opted out, not
    Linux with glibc, training that will run on an accelerator, already re-executed (DONE:
    this is what stops a loop), or every tunable already set by the user."""
    if environ.get(OPT_OUT, "").strip().lower() == "system" or environ.get(DONE):
        return None
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if not platforms.startswith("cpu") and accelerator_plugin_installed(environ):
        return None
    current = parse_tunables(environ.get("GLIBC_TUNABLES", ""))
    ours = {
        name: setting
        for name, setting in TUNABLES.items()
        if name not in current and not environ.get(MALLOC_VARIABLES.get(name, ""))
    }
    if not ours:
        return None
    merged = {**ours, **current}  # the user's settings win
    value = ":".join(f"{name}={setting}" for name, setting in merged.items())
    return {**environ, "GLIBC_TUNABLES": value, DONE: "1"}


def launched_as_program() -> bool:
    """This process runs the calling script as its own program: `python SCRIPT ARGS`,
    `python -m MODULE ARGS`, `python -c CODE ARGS` or an installed command, with no debugger,
    tracer, notebook or interactive session around it. Re-executing anything else would restart
    the host program (or, for a script read from stdin, run an empty one)."""
    argv, original = sys.argv, getattr(sys, "orig_argv", None)
    if not argv or not original or len(original) <= len(argv) or not sys.executable:
        return False
    if argv[0] in ("", "-") or sys.flags.interactive or hasattr(sys, "ps1"):
        return False
    if sys.gettrace() is not None or any(host in sys.modules for host in HOSTS):
        return False
    start = len(original) - len(argv)  # where the program's own arguments begin
    if original[start + 1 :] != argv[1:]:
        return False
    program, option = original[start], original[start - 1]
    if argv[0] == "-c":
        return option == "-c"
    if option == "-m":  # the module the command line names is the one running as __main__
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        return getattr(spec, "name", None) in (program, f"{program}.__main__")
    return program == argv[0]


def reexec_with_tuned_malloc() -> None:
    """Replace this process by the same command with the tunables set; return (changing
    nothing) where tuned_environment says so. Call it first thing in a command's entry point,
    before JAX is imported and before anything is printed."""
    if not launched_as_program():  # first: cheap, and spares a host the plugin scan
        return
    environ = tuned_environment(os.environ)
    if environ is None:
        # The image a re-exec started (or none is needed): the signals held across the exec
        # (below) are let through, as for a caller without interrupt_exits_at_once.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        return
    for stream in (sys.stdout, sys.stderr):  # what was printed must not be lost (or doubled)
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):  # closed or no stream
            pass
    # Ctrl-C and SIGTERM blocked across the exec (a blocked signal stays pending in the new
    # image): during the new interpreter's start they printed a KeyboardInterrupt traceback;
    # now they arrive when its command unblocks them (files.interruptions.
    # interrupt_exits_at_once), one line and 130 / 143.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
