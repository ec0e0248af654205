"""The beam-search cache reorder on XLA:CPU: the gather's forms, and the copy after it.

    python bench/results/decode_limits/reorder_forms.py

The self-attention cache of a batch-8 beam-4 opus-mt-size decode at its average length over
64 new tokens with the growing cache (48 slots): 12 leaves (6 layers, keys and values) of
(32 rows, 8 heads, 48, 64) float32, 37.7 MB. Each form runs 16 times in a jitted fori_loop,
the cache the loop's carry; ms per reorder, median of 5:
- take_along_axis (what decoding.cache does), jnp.take on flat row indices, the same on a 2-D
  view, 32 dynamic slices concatenated, a static flip (a fixed permutation: XLA's plain
  copy), and numpy's take;
- then a step's write of one position plus the reorder, as the engine's loop does it (one
  carry), against two steps per iteration with the cache alternating between two buffers
  (bench/results/decode_limits/double_buffer.patch does the same in decoding/engine.py).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

B, K, H, L, D, LEAVES = 8, 4, 8, 48, 64, 12
rng = np.random.default_rng(0)
CACHE = [
    jnp.asarray(rng.standard_normal((B * K, H, L, D), dtype=np.float32)) for _ in range(LEAVES)
]
PARENTS = jnp.asarray(rng.integers(0, K, (B, K)), jnp.int32)


def flat_rows(parents):
    return (parents + jnp.arange(B)[:, None] * K).reshape(-1)


def take_along(x, parents):
    x = x.reshape((B, K) + x.shape[1:])
    index = parents.reshape(B, K, 1, 1, 1)
    return jnp.take_along_axis(x, index, axis=1).reshape((B * K,) + x.shape[2:])


FORMS = {
    "take_along_axis": take_along,
    "take, flat rows": lambda x, p: jnp.take(x, flat_rows(p), axis=0),
    "take, 2-D view": lambda x, p: jnp.take(x.reshape(B * K, -1), flat_rows(p), 0).reshape(x.shape),
    "dynamic slices": lambda x, p: jnp.concatenate(
        [jax.lax.dynamic_slice_in_dim(x, flat_rows(p)[r], 1, 0) for r in range(B * K)]
    ),
    "static flip": lambda x, p: jnp.flip(x, 0),
}


def timed(fn, loops=16) -> float:
    jax.block_until_ready(fn(CACHE, PARENTS))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(fn(CACHE, PARENTS))
        times.append((time.perf_counter() - start) / loops)
    return 1e3 * float(np.median(times))


def write_and_reorder(x, parents, t):
    new = jnp.full((B * K, H, 1, D), t.astype(jnp.float32))
    x = jax.lax.dynamic_update_slice(x, new, (0, 0, t % L, 0))
    return take_along(x, (parents + t) % K)


def one_carry(cache, parents):
    return jax.lax.fori_loop(
        0, 16, lambda t, c: [write_and_reorder(x, parents, t) for x in c], cache
    )


def two_buffers(cache, parents):
    def body(s, carry):
        a, _ = carry
        b = [write_and_reorder(x, parents, 2 * s) for x in a]
        return [write_and_reorder(x, parents, 2 * s + 1) for x in b], b

    scratch = [jnp.zeros_like(x) for x in cache]
    return jax.lax.fori_loop(0, 8, body, (cache, scratch))[0]


def main() -> None:
    print(f"cache {LEAVES * B * K * H * L * D * 4 / 1e6:.1f} MB", flush=True)
    for _ in range(2):
        for name, form in FORMS.items():
            run = jax.jit(
                lambda c, p, form=form: jax.lax.fori_loop(
                    0, 16, lambda _, xs: [form(x, p) for x in xs], c
                )
            )
            print(f"{name:18s} {timed(run):.2f} ms", flush=True)
    rows = np.asarray(flat_rows(PARENTS))
    arrays = [np.asarray(x) for x in CACHE]
    start = time.perf_counter()
    for _ in range(16):
        arrays = [np.take(x, rows, axis=0) for x in arrays]
    print(f"{'numpy take':18s} {1e3 * (time.perf_counter() - start) / 16:.2f} ms", flush=True)
    one, two = jax.jit(one_carry)(CACHE, PARENTS), jax.jit(two_buffers)(CACHE, PARENTS)
    same = all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))
    for _ in range(2):
        print(f"write + reorder, one carry    {timed(jax.jit(one_carry)):.2f} ms", flush=True)
        print(f"write + reorder, two buffers  {timed(jax.jit(two_buffers)):.2f} ms", flush=True)
    print(f"same cache after 16 steps: {same}")


if __name__ == "__main__":
    main()
