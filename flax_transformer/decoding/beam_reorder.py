"""Beam search's KV-cache reorder in place, on the CPU: `reorder(cache, parents, filled)`.

Every step of beam search makes each beam's cached keys and values follow its parent. As a
gather, XLA writes the whole cache anew (every slot, also the beams that keep their own
history and the empty slots past the filled ones) and the while loop copies it once more into
its carry: in a batch-8 beam-4 opus-mt step on a 2-core CPU that was a third of the step
(bench/NOTES.md, "The cache reorder in place"). `beam_reorder.cc` moves, in place, only the
filled slots of the beams whose parent is another beam. It is an XLA FFI custom call with its
result aliased to the cache; XLA adds no copy when the reorder is the cache's first use in a
step, which is why the engine applies a step's parents at the start of the next one
(decoding/engine.py).

Which path runs (`use_native`, asked when a search is traced): the environment variable
FLAX_TRANSFORMER_REORDER_KERNEL = `auto` (the default: the kernel where it runs, else XLA's
gather), `xla` (always the gather) or `native` (the kernel, an error saying why where it cannot
run). It needs Linux on x86-64, JAX on the CPU and a C++ compiler (built on first use and
cached: nn.native_build). Both paths give the same cache in every slot a search reads.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from flax_transformer.nn.native_build import build_and_register, switch_value, unsupported_platform

SWITCH = "FLAX_TRANSFORMER_REORDER_KERNEL"
CHOICES = ("auto", "xla", "native")
SOURCE = Path(__file__).with_name("beam_reorder.cc")
FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-w")
TARGET = "flax_transformer_beam_reorder"


def reason_unavailable() -> str | None:
    """None when the kernel runs here (and the switch allows it), else why not."""
    if switch_value(SWITCH, CHOICES) == "xla":
        return f"{SWITCH}=xla"
    why = unsupported_platform()
    return why if why is not None else _load()[1]


def use_native() -> bool:
    """Whether beam search should reorder its cache with the kernel; ValueError when the switch
    says `native` and it cannot run here."""
    why = reason_unavailable()
    if why is not None and switch_value(SWITCH, CHOICES) == "native":
        raise ValueError(f"{SWITCH}=native, but the reorder kernel cannot run here: {why}")
    return why is None


@functools.cache
def _load():
    """(the loaded, registered library, None) or (None, why not)."""
    return build_and_register(SOURCE, FLAGS, {TARGET: "beam_reorder"})


def reorder(cache: jax.Array, parents: jax.Array, filled: jax.Array) -> jax.Array:
    """cache (B*K, heads, T, head_dim), parents (B, K) within each row, filled () the slots
    written so far -> the cache with every beam's first `filled` slots its parent's (the slots
    past them as they were: empty, masked). Computed in place where XLA can alias the cache."""
    batch, beams = parents.shape
    if cache.ndim != 4 or cache.shape[0] != batch * beams:
        raise ValueError(
            f"beam_reorder: cache {cache.shape} is not (B*K, heads, T, head_dim) for "
            f"parents {parents.shape}"
        )
    call = jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype), input_output_aliases={0: 0}
    )
    with jax.named_scope("beam_reorder"):  # names the call in profiles (bench.profile_decode)
        return call(cache, parents.astype(jnp.int32), jnp.asarray(filled, jnp.int32))
