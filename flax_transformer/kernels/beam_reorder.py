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

Whether it runs is `KERNELS.reorder` (kernels.switches: FLAX_TRANSFORMER_REORDER_KERNEL =
auto | xla | native), asked when a search is traced. It needs Linux on x86-64, JAX on the CPU
and the library built by `ftx kernels build`. Both paths give the same cache in every slot a
search reads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from flax_transformer.kernels.libraries import BEAM_REORDER_TARGET as TARGET


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
