"""A beam-search step's attention cores on XLA:CPU: the einsum (dot_general) form the model
uses against a broadcast multiply and sum.

    python bench/results/decode_limits/attention_forms.py

Shapes of a batch-8 beam-4 opus-mt-size decode, one layer, float32: cross-attention (8 source
rows, the 4 beams of a row as 4 queries, 8 heads, 32 source tokens, head_dim 64) and
self-attention over the cache (32 rows, 1 query, 8 heads, 48 slots). Each form runs 50 times
in a jitted fori_loop; ms per call, median of 7, and the largest difference between the forms.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(0)


def einsum_form(q, k, v):  # q (b, q, h, d), k/v (b, h, s, d), as nn.attention's cache layout
    weights = jax.nn.softmax(jnp.einsum("bqhd,bhkd->bhqk", q, k) / 8.0, -1)
    return jnp.einsum("bhqk,bhkd->bqhd", weights, v)


def broadcast_form(q, k, v):
    scores = jnp.sum(q.transpose(0, 2, 1, 3)[:, :, :, None, :] * k[:, :, None], -1) / 8.0
    weights = jax.nn.softmax(scores, -1)  # (b, h, q, s)
    return jnp.sum(weights[..., None] * v[:, :, None], -2).transpose(0, 2, 1, 3)


def timed(form, q, k, v, loops=50) -> float:
    def run(q, k, v):
        return jax.lax.fori_loop(0, loops, lambda _, c: form(c, k, v) * 0.5 + c, q)

    run = jax.jit(run)
    jax.block_until_ready(run(q, k, v))
    times = []
    for _ in range(7):
        start = time.perf_counter()
        jax.block_until_ready(run(q, k, v))
        times.append((time.perf_counter() - start) / loops)
    return 1e3 * float(np.median(times))


def main() -> None:
    cases = {
        "cross-attention, 8 rows x 4 beams, 32 source tokens": (8, 4, 32),
        "self-attention, 32 rows, 48 cache slots": (32, 1, 48),
    }
    for name, (rows, queries, keys) in cases.items():
        q = jnp.asarray(rng.standard_normal((rows, queries, 8, 64)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((rows, 8, keys, 64)), jnp.float32)
        v = jnp.asarray(rng.standard_normal((rows, 8, keys, 64)), jnp.float32)
        diff = float(jnp.max(jnp.abs(einsum_form(q, k, v) - broadcast_form(q, k, v))))
        for _ in range(2):
            print(
                f"{name}: einsum {timed(einsum_form, q, k, v):.3f} ms, "
                f"broadcast {timed(broadcast_form, q, k, v):.3f} ms (max diff {diff:.1e})",
                flush=True,
            )


if __name__ == "__main__":
    main()
