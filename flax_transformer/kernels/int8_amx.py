"""int8 products on weights packed once (Intel AMX, or AVX2): the fast path of nn.int8_products.

XLA:CPU's own int8 dot (YNNPACK) packs its weight operand into the tile layout inside every
call: in a batch-8 beam-4 decode that packing took twice the time of the products themselves
(bench/NOTES.md, "What is left of #28's decode targets"). `int8_amx.cc` is a small kernel
that reads weights packed at load time (`pack`), called from jitted code as an XLA FFI custom
call (`product`): int8 x int8 -> int32, exact, so it returns what the XLA dot returns.
`int8_avx2.cc` reads the same packed layout with AVX2 (vpmaddubsw on |x| and the weights with
x's sign: exact for values in [-127, 127], which is all nn.int8 makes), for CPUs without AMX.

Whether one runs, and which, is `KERNELS.int8` (kernels.switches: FLAX_TRANSFORMER_INT8_KERNEL
= auto | xla | amx | avx2; auto takes AMX where the CPU has it, else AVX2). It needs Linux on
x86-64, JAX on the CPU, the CPU's flags (amx_tile and amx_int8: Intel Xeon since Sapphire
Rapids, and the kernel's permission for the process; or avx2) and the library built by
`ftx kernels build`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.kernels.libraries import INT8_AMX_TARGET, INT8_AVX2_TARGET

TARGETS = {"amx": INT8_AMX_TARGET, "avx2": INT8_AVX2_TARGET}  # KERNELS.int8's build -> target

K_MULTIPLE, N_MULTIPLE = 64, 32  # the kernel's tile sizes: K in 64-byte steps, N in 32 columns


def supports(k: int) -> bool:
    """Whether a product with k input features fits the kernel's tiles."""
    return k % K_MULTIPLE == 0


def pack(values: np.ndarray) -> np.ndarray:
    """int8 weights (K, N) -> (N' / 16, K / 4, 16, 4), the layout the kernel reads, N padded
    with zero columns to N' (a multiple of 32); packed[b, q, j, i] = values[4q + i, 16b + j]."""
    k, n = values.shape
    if not supports(k):
        raise ValueError(f"int8_amx.pack: K = {k} is not a multiple of {K_MULTIPLE}")
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.int8)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k // 4, 4, -1, 16).transpose(2, 0, 3, 1))


def product(x: jax.Array, packed: jax.Array, n: int, build: str = "amx") -> jax.Array:
    """x int8 (M, K) times the packed (K, n) weights -> int32 (M, n), exact, in `build`'s
    kernel ("amx" or "avx2", loaded: KERNELS.int8.choose())."""
    columns = packed.shape[0] * 16
    out_shape = jax.ShapeDtypeStruct((x.shape[0], columns), jnp.int32)
    call = jax.ffi.ffi_call(TARGETS[build], out_shape)
    out = call(x, packed)
    return out if columns == n else out[:, :n]
