"""int8 products on Intel AMX with the weights packed once: the fast path of nn.int8_products.

XLA:CPU's own int8 dot (YNNPACK) packs its weight operand into the tile layout inside every
call: in a batch-8 beam-4 decode that packing took twice the time of the products themselves
(bench/NOTES.md, "What is left of #28's decode targets"). `int8_amx.cc` is a small kernel
that reads weights packed at load time (`pack`), called from jitted code as an XLA FFI custom
call (`product`): int8 x int8 -> int32, exact, so it returns what the XLA dot returns.

The kernel is compiled from source the first time a process needs it and cached
(nn.native_build).

Which path runs (`reason_unavailable`, read when a model is quantised): the environment variable
FLAX_TRANSFORMER_INT8_KERNEL = `auto` (the default: AMX where it works, XLA's dot elsewhere),
`xla` (always XLA's dot) or `amx` (AMX, an error saying why where it cannot run). AMX needs
Linux on x86-64, a CPU with amx_tile and amx_int8 (Intel Xeon since Sapphire Rapids), the
kernel's permission for the process, and a C++ compiler.
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

SWITCH = "FLAX_TRANSFORMER_INT8_KERNEL"
CHOICES = ("auto", "xla", "amx")
SOURCE = HERE / "int8_amx.cc"
FLAGS = ("-O3", "-std=c++17", "-mamx-tile", "-mamx-int8", "-fPIC", "-shared", "-w")
TARGET = "flax_transformer_int8_amx_product"
K_MULTIPLE, N_MULTIPLE = 64, 32  # the kernel's tile sizes: K in 64-byte steps, N in 32 columns


def choice() -> str:
    """The switch's value; ValueError naming the variable for anything else."""
    return switch_value(SWITCH, CHOICES)


def reason_unavailable() -> str | None:
    """None when the AMX kernel will run here, else one line saying why not. Builds and loads
    the kernel on the first call that gets that far (cached)."""
    if choice() == "xla":
        return f"{SWITCH}=xla"
    why = unsupported_platform()
    if why is not None:
        return why
    missing = {"amx_tile", "amx_int8"} - cpu_flags()
    if missing:
        return f"this CPU lacks {' and '.join(sorted(missing))}"
    return _load()[1]


def use_amx() -> bool:
    """Whether int8 products should run on AMX: per the switch, and where the kernel runs;
    ValueError when the switch says `amx` and it cannot."""
    why = reason_unavailable()
    if why is not None and choice() == "amx":
        raise ValueError(f"{SWITCH}=amx, but the AMX int8 kernel cannot run here: {why}")
    return why is None


def supports(k: int) -> bool:
    """Whether a product with k input features fits the kernel's tiles."""
    return k % K_MULTIPLE == 0


@functools.cache
def _load():
    """(the loaded, registered library, None) or (None, why not)."""
    lib, why = build_and_register(SOURCE, FLAGS, {TARGET: "int8_amx_product"})
    if lib is not None and lib.int8_amx_request_permission() != 0:
        return None, "the operating system refused this process the AMX tile state"
    return lib, why


def pack(values: np.ndarray) -> np.ndarray:
    """int8 weights (K, N) -> (N' / 16, K / 4, 16, 4), the layout the kernel reads, N padded
    with zero columns to N' (a multiple of 32); packed[b, q, j, i] = values[4q + i, 16b + j]."""
    k, n = values.shape
    if not supports(k):
        raise ValueError(f"int8_amx.pack: K = {k} is not a multiple of {K_MULTIPLE}")
    padded = np.zeros((k, -(-n // N_MULTIPLE) * N_MULTIPLE), np.int8)
    padded[:, :n] = values
    return np.ascontiguousarray(padded.reshape(k // 4, 4, -1, 16).transpose(2, 0, 3, 1))


def product(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """x int8 (M, K) times the packed (K, n) weights -> int32 (M, n), exact."""
    columns = packed.shape[0] * 16
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], columns), jnp.int32))
    out = call(x, packed)
    return out if columns == n else out[:, :n]
