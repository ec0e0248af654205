"""Where the packed kernel stops paying: one product per shape (the FFN's (512, 2048) and
(2048, 512), the (512, 58101) output table), XLA's dot against nn.f32_packed's kernel, at 16
to 512 rows, 10 products inside one jitted loop, alternated, best of 3 rounds. What
f32_packed.MAX_ROW_BYTES rests on (above it, products run as XLA's dot).

    .venv/bin/python bench/results/f32_packed/rows.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.nn import f32_packed

SHAPES = [(512, 2048), (2048, 512), (512, 58101)]
ROWS = (16, 32, 64, 128, 256, 512)
REPS = 10


def looped(product):
    @jax.jit
    def run(x, w):
        def body(_, acc):
            return acc + jnp.sum(product(x + acc, w), axis=1, keepdims=True) * 1e-9

        return jax.lax.fori_loop(0, REPS, body, jnp.zeros((x.shape[0], 1), jnp.float32))

    return run


def main():
    f32_packed.MAX_ROW_BYTES = 1 << 62  # the kernel at every row count measured here
    print(f"f32_packed build: {f32_packed.variant()[0]}")
    rng = np.random.default_rng(0)
    for k, n in SHAPES:
        w = rng.standard_normal((k, n), dtype=np.float32) * 0.05
        plain, packed = jnp.asarray(w), jnp.asarray(f32_packed.pack(w))
        xla = looped(lambda x, w: x @ w)
        kernel = looped(lambda x, p, n=n: f32_packed.product(x, p, n))
        for m in ROWS:
            x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
            xla(x, plain).block_until_ready(), kernel(x, packed).block_until_ready()
            best = {"xla": np.inf, "packed": np.inf}
            for _ in range(3):
                for name, fn, arg in (("xla", xla, plain), ("packed", kernel, packed)):
                    start = time.perf_counter()
                    fn(x, arg).block_until_ready()
                    best[name] = min(best[name], (time.perf_counter() - start) / REPS)
            print(
                f"({k}, {n}) rows {m}: XLA {best['xla'] * 1e3:.3f} ms, packed "
                f"{best['packed'] * 1e3:.3f} ms, {best['xla'] / best['packed']:.2f}x"
            )


if __name__ == "__main__":
    main()
