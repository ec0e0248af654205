"""float32 products of a few rows on weights packed once: the fast path of nn.f32_products.

A decoding step multiplies a few rows (the batch, times the beams) by every weight matrix.
XLA:CPU's dot re-packs the weight operand inside every call, for the (vocab, d_model) output
table a whole transpose of it (bench/NOTES.md, "float32 products on weights packed once").
`f32_packed.cc` reads weights packed at load (`pack`: 16-column panels, (N / 16, K, 16)) and
streams each panel once per call with AVX-512 fused multiply-adds; it is called from jitted
code as an XLA FFI custom call (`product`). Each output is one chain of multiply-adds over the
input features in order: the same rounding whatever the threads, a different rounding from
XLA's dot (float32 products differ at ~1e-7 relative, as any two GEMMs do).

Which path runs (`variant`, read when a model is packed): the environment variable
FLAX_TRANSFORMER_F32_KERNEL = `auto` (the default: the kernel built for AVX-512 where the CPU
has it, else the one built for AVX2 + FMA, else XLA's dot), `xla` (always XLA's dot), `avx512`
or `avx2` (that build, an error saying why where it cannot run). Both builds give the same
bits. They need Linux on x86-64 and a C++ compiler (each is built on first use and cached:
nn.native_build).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.nn.native_build import (
    HERE,
    build_and_register,
    cpu_flags,
    switch_value,
    unsupported_platform,
)

SWITCH = "FLAX_TRANSFORMER_F32_KERNEL"
SOURCE = HERE / "f32_packed.cc"
COMMON_FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-w")
# build -> (the CPU flags it needs, its compiler flags); preferred first
BUILDS = {
    "avx512": (("avx512f",), ("-mavx512f", "-mfma")),
    "avx2": (("avx2", "fma"), ("-mavx2", "-mfma", "-DF32_PACKED_AVX2")),
}
CHOICES = ("auto", "xla", *BUILDS)
N_MULTIPLE = 32  # the kernel computes 32 columns (two panels) at a time
# The kernel reads all the rows again for every pair of panels: it pays while they stay in
# cache. Measured (bench/results/f32_packed/rows.py): faster than XLA's dot up to the largest
# tried, 512 rows of 2048 features (4 MiB, 1.43x) and 512 of 512 (1.2-1.5x). Rows of more
# bytes (an encoder over a long batch, a long prompt) run as XLA's dot on the packed layout.
MAX_ROW_BYTES = 4 << 20


def choice() -> str:
    """The switch's value; ValueError naming the variable for anything else."""
    return switch_value(SWITCH, CHOICES)


def target(build: str) -> str:
    """The FFI target name of a build."""
    return f"flax_transformer_f32_packed_product_{build}"


def _why_not(build: str) -> str | None:
    """None when `build` runs here, else why not (builds and loads it, once)."""
    why = unsupported_platform()
    if why is not None:
        return why
    missing = set(BUILDS[build][0]) - cpu_flags()
    if missing:
        return f"this CPU lacks {' and '.join(sorted(missing))}"
    return _load(build)[1]


def variant() -> tuple[str | None, str | None]:
    """(the build that runs, None) or (None, why XLA's dot runs); ValueError when the switch
    names a build that cannot run here."""
    wanted = choice()
    if wanted == "xla":
        return None, f"{SWITCH}=xla"
    reasons = []
    for build in BUILDS if wanted == "auto" else (wanted,):
        why = _why_not(build)
        if why is None:
            return build, None
        reasons.append(f"{build}: {why}")
    if wanted != "auto":
        raise ValueError(f"{SWITCH}={wanted}, but that float32 kernel cannot run here: {why}")
    return None, "; ".join(reasons)


def reason_unavailable() -> str | None:
    """None when a build of the kernel runs here (and the switch allows it), else why not."""
    return variant()[1]


def use_packed() -> bool:
    """Whether float32 products should run in the kernel (see `variant`)."""
    return variant()[0] is not None


@functools.cache
def _load(build: str):
    """(the loaded, registered library of `build`, None) or (None, why not)."""
    flags = COMMON_FLAGS + BUILDS[build][1]
    return build_and_register(SOURCE, flags, {target(build): "f32_packed_product"})


def pack(values: np.ndarray) -> np.ndarray:
    """float32 weights (K, N) -> (N' / 16, K, 16), the layout the kernel reads, N padded with
    zero columns to N' (a multiple of 32); packed[p, k, j] = values[k, 16p + j]."""
    k, n = values.shape
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.float32)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k, -1, 16).transpose(1, 0, 2))


def product(x: jax.Array, packed: jax.Array, n: int, build: str | None = None) -> jax.Array:
    """x float32 (M, K) times the packed (K, n) weights -> float32 (M, n), in `build` (default:
    the one `variant` picks); rows of more than MAX_ROW_BYTES in XLA's dot."""
    if x.shape[1] != packed.shape[1]:
        raise ValueError(
            f"f32_packed.product: x has {x.shape[1]} features, the weights {packed.shape[1]}"
        )
    columns = packed.shape[0] * 16
    if x.shape[0] * x.shape[1] * 4 > MAX_ROW_BYTES:  # (M, K) x (N'/16, K, 16) -> (M, N')
        out = jnp.einsum("mk,pkj->mpj", x.astype(jnp.float32), packed).reshape(-1, columns)
        return out if columns == n else out[:, :n]
    if build is None:
        build, why = variant()
        if build is None:
            raise ValueError(f"f32_packed.product: no build of the kernel runs here ({why})")
    out_shape = jax.ShapeDtypeStruct((x.shape[0], columns), jnp.float32)
    out = jax.ffi.ffi_call(target(build), out_shape)(x.astype(jnp.float32), packed)
    return out if columns == n else out[:, :n]
