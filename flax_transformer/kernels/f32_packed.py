"""float32 products of a few rows on weights packed once: the fast path of nn.f32_products.

A decoding step multiplies a few rows (the batch, times the beams) by every weight matrix.
XLA:CPU's dot re-packs the weight operand inside every call, for the (vocab, d_model) output
table a whole transpose of it (bench/NOTES.md, "float32 products on weights packed once").
`f32_packed.cc` reads weights packed at load (`pack`: 16-column panels, (N / 16, K, 16)) and
streams each panel once per call with AVX-512 fused multiply-adds; it is called from jitted
code as an XLA FFI custom call (`product`). Each output is one chain of multiply-adds over the
input features in order: the same rounding whatever the threads, a different rounding from
XLA's dot (float32 products differ at ~1e-7 relative, as any two GEMMs do).

Whether it runs, and which build, is `KERNELS.f32` (kernels.switches:
FLAX_TRANSFORMER_F32_KERNEL = auto | xla | avx512 | avx2; auto takes the AVX-512 build where
the CPU has it, else the AVX2 + FMA one). Both builds give the same bits. They need Linux on
x86-64, JAX on the CPU and the libraries built by `ftx kernels build`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.kernels import load
from flax_transformer.kernels.libraries import f32_target as target
from flax_transformer.kernels.switches import KERNELS

N_MULTIPLE = 32  # the kernel computes 32 columns (two panels) at a time
# The kernel reads all the rows again for every pair of panels: it pays while they stay in
# cache. Measured (`python -m bench.f32_rows`): faster than XLA's dot up to the largest
# tried, 512 rows of 2048 features (4 MiB, 1.43x) and 512 of 512 (1.2-1.5x). Rows of more
# bytes (an encoder over a long batch, a long prompt) run as XLA's dot on the packed layout.
MAX_ROW_BYTES = 4 << 20


def pack(values: np.ndarray) -> np.ndarray:
    """float32 weights (K, N) -> (N' / 16, K, 16), the layout the kernel reads, N padded with
    zero columns to N' (a multiple of 32); packed[p, k, j] = values[k, 16p + j]."""
    k, n = values.shape
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.float32)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k, -1, 16).transpose(1, 0, 2))


def product(x: jax.Array, packed: jax.Array, n: int, build: str | None = None) -> jax.Array:
    """x float32 (M, K) times the packed (K, n) weights -> float32 (M, n), in `build` (default:
    the one KERNELS.f32 chooses); rows of more than MAX_ROW_BYTES in XLA's dot."""
    if x.shape[1] != packed.shape[1]:
        raise ValueError(
            f"f32_packed.product: x has {x.shape[1]} features, the weights {packed.shape[1]}"
        )
    columns = packed.shape[0] * 16
    if x.shape[0] * x.shape[1] * 4 > MAX_ROW_BYTES:  # (M, K) x (N'/16, K, 16) -> (M, N')
        out = jnp.einsum("mk,pkj->mpj", x.astype(jnp.float32), packed).reshape(-1, columns)
        return out if columns == n else out[:, :n]
    if build is None:
        choice = KERNELS.f32.choose()
        build, why = choice.build, choice.why
        if build is None:
            raise ValueError(f"f32_packed.product: no build of the kernel runs here ({why})")
    else:  # a build named by the caller (tests compare the two): loaded, or why not
        why = load.load(f"f32_packed_{build}")[1]
        if why is not None:
            raise ValueError(f"f32_packed.product: the {build} build cannot run here ({why})")
    out_shape = jax.ShapeDtypeStruct((x.shape[0], columns), jnp.float32)
    out = jax.ffi.ffi_call(target(build), out_shape)(x.astype(jnp.float32), packed)
    return out if columns == n else out[:, :n]
