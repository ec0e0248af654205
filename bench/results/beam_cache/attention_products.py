"""Self-attention of one decoding step over a beam cache, one layer: 8 rows x 4 beams, 8 heads,
64 slots, head_dim 64. The grouped form of beam_cache.patch (each beam's query against its
row's 4 blocks) written as dot_general and as a multiply and a sum, and the per-beam form the
engine runs. ms a call, median of 7 runs of a jitted 64-step loop. bench/NOTES.md, "Tried:
beams that never move the cache".

    python bench/results/beam_cache/attention_products.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

ROWS, HEADS, BEAMS, SLOTS, HEAD_DIM, STEPS = 8, 8, 4, 64, 64, 64


def grouped_dots(q, k, v):  # q (b, G, h, d); k, v (b, h, G * slots, d)
    w = jax.nn.softmax(jnp.einsum("bghd,bhkd->bhgk", q, k), -1)
    return jnp.einsum("bhgk,bhkd->bghd", w, v)


def grouped_multiply_sum(q, k, v):
    s = (jnp.swapaxes(q, 1, 2)[:, :, :, None, :] * k[:, :, None, :, :]).sum(-1)
    w = jax.nn.softmax(s, -1)
    return jnp.swapaxes((w[..., None] * v[:, :, None, :, :]).sum(-2), 1, 2)


def per_beam_dots(q, k, v):  # q (b * G, 1, h, d); k, v (b * G, h, slots, d)
    w = jax.nn.softmax(jnp.einsum("bqhd,bhkd->bhqk", q, k), -1)
    return jnp.einsum("bhqk,bhkd->bqhd", w, v)


def ms_per_call(fn, q, k, v) -> float:
    def loop(q, k, v):
        step = lambda c, _: (c + fn(c, k, v).reshape(c.shape) * 1e-6, None)  # noqa: E731
        return jax.lax.scan(step, q, None, length=STEPS)[0]

    run = jax.jit(loop)
    run(q, k, v).block_until_ready()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        run(q, k, v).block_until_ready()
        times.append(time.perf_counter() - start)
    return sorted(times)[3] / STEPS * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    q = normal(ROWS, BEAMS, HEADS, HEAD_DIM)
    k = normal(ROWS, HEADS, BEAMS * SLOTS, HEAD_DIM)
    v = normal(ROWS, HEADS, BEAMS * SLOTS, HEAD_DIM)
    k1 = normal(ROWS * BEAMS, HEADS, SLOTS, HEAD_DIM)
    print(f"grouped dots {ms_per_call(grouped_dots, q, k, v):.3f} ms")
    print(f"grouped multiply-sum {ms_per_call(grouped_multiply_sum, q, k, v):.3f} ms")
    q1 = q.reshape(ROWS * BEAMS, 1, HEADS, HEAD_DIM)
    print(f"per-beam dots {ms_per_call(per_beam_dots, q1, k1, k1):.3f} ms")
    same = grouped_dots(q, k, v), grouped_multiply_sum(q, k, v)
    np.testing.assert_allclose(*same, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    main()
