"""float32 products of a few rows on weights packed once: the fast path of nn.f32_products.

A decoding step multiplies a few rows (the batch, times the beams) by every weight matrix.
XLA:CPU's dot re-packs the weight operand inside every call, for the (vocab, d_model) output
table a whole transpose of it (bench/NOTES.md, "float32 products on weights packed once").
`f32_packed.cc` reads weights packed at load (`pack`: 16-column panels, (N / 16, K, 16)) and
streams each panel once per call with AVX-512 fused multiply-adds; it is called from jitted
code as an XLA FFI custom call (`product`). Each output is one chain of multiply-adds over the
input features in order: the same rounding whatever the threads, a different rounding from
XLA's dot (float32 products differ at ~1e-7 relative, as any two GEMMs do).

Which path runs (`reason_unavailable`, read when a model is packed): the environment variable
FLAX_TRANSFORMER_F32_KERNEL = `auto` (the default: the kernel where it runs, XLA's dot
elsewhere), `xla` (always XLA's dot) or `avx512` (the kernel, an error saying why where it
cannot run). It needs Linux on x86-64, a CPU with avx512f, and a C++ compiler (the kernel is
built on first use and cached: nn.native_build).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.nn.native_build import (
    HERE,
    build_and_register,
    cpu_flags,
    unsupported_platform,
)

SWITCH = "FLAX_TRANSFORMER_F32_KERNEL"
CHOICES = ("auto", "xla", "avx512")
SOURCE = HERE / "f32_packed.cc"
FLAGS = ("-O3", "-std=c++17", "-mavx512f", "-mfma", "-fPIC", "-shared", "-w")
TARGET = "flax_transformer_f32_packed_product"
N_MULTIPLE = 32  # the kernel computes 32 columns (two panels) at a time


def choice() -> str:
    """The switch's value; ValueError naming the variable for anything else."""
    value = os.environ.get(SWITCH, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{SWITCH}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def reason_unavailable() -> str | None:
    """None when the kernel will run here, else one line saying why not. Builds and loads it
    on the first call that gets that far (cached)."""
    if choice() == "xla":
        return f"{SWITCH}=xla"
    why = unsupported_platform()
    if why is not None:
        return why
    if "avx512f" not in cpu_flags():
        return "this CPU lacks avx512f"
    return _load()[1]


def use_packed() -> bool:
    """Whether float32 products should run in the kernel: per the switch, and where it runs;
    ValueError when the switch says `avx512` and it cannot."""
    why = reason_unavailable()
    if why is not None and choice() == "avx512":
        raise ValueError(f"{SWITCH}=avx512, but the float32 kernel cannot run here: {why}")
    return why is None


@functools.cache
def _load():
    """(the loaded, registered library, None) or (None, why not)."""
    return build_and_register(SOURCE, FLAGS, {TARGET: "f32_packed_product"})


def pack(values: np.ndarray) -> np.ndarray:
    """float32 weights (K, N) -> (N' / 16, K, 16), the layout the kernel reads, N padded with
    zero columns to N' (a multiple of 32); packed[p, k, j] = values[k, 16p + j]."""
    k, n = values.shape
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.float32)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k, -1, 16).transpose(1, 0, 2))


def product(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x float32 (M, K) times the packed (K, n) weights -> float32 (M, n)."""
    if x.shape[1] != packed.shape[1]:
        raise ValueError(
            f"f32_packed.product: x has {x.shape[1]} features, the weights {packed.shape[1]}"
        )
    columns = packed.shape[0] * 16
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], columns), jnp.float32))
    out = call(x.astype(jnp.float32), packed)
    return out if columns == n else out[:, :n]
