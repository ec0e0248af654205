"""One decoding step's float32 matrix products (opus-mt size: 36 (512, 512), 6 (512, 2048),
6 (2048, 512) and the (512, 58101) output table), XLA's dot against nn.f32_packed's kernel on
weights packed once, each chain 20 times inside one jitted loop, alternated, best of 3 rounds.

    FLAX_TRANSFORMER_F32_KERNEL=avx512 .venv/bin/python bench/results/f32_packed/chain.py
    (avx2 for the AVX2 build; --rows 1,4,32 by default)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.nn import f32_packed

SHAPES = [(512, 512)] * 36 + [(512, 2048), (2048, 512)] * 6 + [(512, 58101)]
REPS = 20


def chain(products):
    """A jitted loop of REPS chains; every product reads the running sum and all of every
    product's outputs are summed into it, so no part of any product can be dropped."""

    @jax.jit
    def run(x, weights):
        def body(_, acc):
            for (k, n), w in zip(SHAPES, weights, strict=True):
                rows = jnp.tile(x + acc, (1, k // x.shape[1]))
                acc = acc + jnp.sum(products(rows, w, n), axis=1, keepdims=True) * 1e-9
            return acc

        return jax.lax.fori_loop(0, REPS, body, jnp.zeros((x.shape[0], 1), jnp.float32))

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,4,32")
    args = parser.parse_args()
    build, why = f32_packed.variant()
    print(f"f32_packed build: {build or 'none (' + why + ')'}")
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in SHAPES]
    plain = [jnp.asarray(w) for w in weights]
    packed = [jnp.asarray(f32_packed.pack(w)) for w in weights]
    xla = chain(lambda rows, w, n: rows @ w)
    kernel = chain(f32_packed.product)  # the build `variant` picks (FLAX_TRANSFORMER_F32_KERNEL)
    for m in map(int, args.rows.split(",")):
        x = jnp.asarray(rng.standard_normal((m, 512), dtype=np.float32))
        xla(x, plain).block_until_ready(), kernel(x, packed).block_until_ready()  # compile
        best = {"xla": np.inf, "packed": np.inf}
        for _ in range(3):
            for name, fn, ws in (("xla", xla, plain), ("packed", kernel, packed)):
                start = time.perf_counter()
                fn(x, ws).block_until_ready()
                best[name] = min(best[name], (time.perf_counter() - start) / REPS)
        print(
            f"rows {m}: XLA's dot {best['xla'] * 1e3:.2f} ms a chain, packed "
            f"{best['packed'] * 1e3:.2f} ms, {best['xla'] / best['packed']:.2f}x"
        )


if __name__ == "__main__":
    main()
