"""Where the packed float32 kernel stops paying: XLA's dot against kernels.f32_packed by rows.

    python -m bench.f32_rows [--rows 16,32,64,128,256,512] [--rounds 3]

What it measures: one product per shape of an opus-mt-size decoder (the feed-forward layer's
(512, 2048) and (2048, 512), the (512, 58101) output table), XLA's dot on the plain weights
against the kernel on weights packed once (`kernels.f32_packed.product`), at 16 to 512 rows,
10 products inside one jitted loop, the two alternated, best of `--rounds` rounds; milliseconds
per product and the ratio. What `f32_packed.MAX_ROW_BYTES` rests on (rows of more bytes run as
XLA's dot): the kernel's row limit is lifted for the run. Needs the kernel built (`ftx kernels
build`) and a CPU it runs on; otherwise it says why and exits 2. It was
bench/results/f32_packed/rows.py until 2026-11-28 (its runs: bench/NOTES.md, "Many rows").
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.kernels import f32_packed
from flax_transformer.kernels.switches import KERNELS

SHAPES = [(512, 2048), (2048, 512), (512, 58101)]
REPS = 10  # products per timed call, inside one jitted loop


def looped(product):
    """A jitted loop of REPS products, each fed by the last (so none is hoisted)."""

    @jax.jit
    def run(x, w):
        def body(_, acc):
            return acc + jnp.sum(product(x + acc, w), axis=1, keepdims=True) * 1e-9

        return jax.lax.fori_loop(0, REPS, body, jnp.zeros((x.shape[0], 1), jnp.float32))

    return run


def time_shape(k: int, n: int, rows: list[int], rounds: int, rng) -> list[dict]:
    w = rng.standard_normal((k, n), dtype=np.float32) * 0.05
    plain, packed = jnp.asarray(w), jnp.asarray(f32_packed.pack(w))
    xla = looped(lambda x, w: x @ w)
    kernel = looped(lambda x, p: f32_packed.product(x, p, n))
    found = []
    for m in rows:
        x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        xla(x, plain).block_until_ready(), kernel(x, packed).block_until_ready()  # compile
        best = {"xla": np.inf, "packed": np.inf}
        for _ in range(rounds):
            for name, fn, arg in (("xla", xla, plain), ("packed", kernel, packed)):
                start = time.perf_counter()
                fn(x, arg).block_until_ready()
                best[name] = min(best[name], (time.perf_counter() - start) / REPS)
        found.append({"shape": (k, n), "rows": m, "xla_ms": best["xla"] * 1e3,
                      "packed_ms": best["packed"] * 1e3})  # fmt: skip
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.f32_rows", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", default="16,32,64,128,256,512", help="row counts, commas")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows {args.rows!r}: give whole numbers separated by commas")
    if min(rows) <= 0 or args.rounds <= 0:
        parser.error("--rows and --rounds must be positive")
    choice = KERNELS.f32.choose()
    if choice.build is None:
        why = f"the float32 kernel does not run here ({choice.why})"
        print(f"bench.f32_rows: {why}", file=sys.stderr)
        return 2
    f32_packed.MAX_ROW_BYTES = 1 << 62  # the kernel at every row count measured here
    print(f"f32_packed build: {choice.build}")
    rng = np.random.default_rng(0)
    for k, n in SHAPES:
        for r in time_shape(k, n, rows, args.rounds, rng):
            print(
                f"({k}, {n}) rows {r['rows']}: XLA {r['xla_ms']:.3f} ms, packed "
                f"{r['packed_ms']:.3f} ms, {r['xla_ms'] / r['packed_ms']:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
