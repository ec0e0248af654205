"""The 58101 x 512 output table times 1-32 rows: XLA (`x @ E.T`, and `x @ Et` with a transposed
copy) against torch (2 threads), medians of 20 calls, ms. bench/NOTES.md, "Where a batch-8
beam-4 step goes here".

    python bench/results/xeon/output_product.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

VOCAB, D_MODEL = 58101, 512


def median_ms(fn, calls: int = 20) -> float:
    fn()  # compiles / warms up
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e3


def main() -> None:
    torch.set_num_threads(2)
    table = np.random.rand(VOCAB, D_MODEL).astype(np.float32) * 0.01
    table_t = np.ascontiguousarray(table.T)
    xla_tied = jax.jit(lambda x, e: x @ e.T)
    xla_transposed = jax.jit(lambda x, et: x @ et)
    e, et = jnp.asarray(table), jnp.asarray(table_t)
    te, tet = torch.from_numpy(table), torch.from_numpy(table_t)
    for rows in (1, 4, 8, 32):
        x = np.random.rand(rows, D_MODEL).astype(np.float32)
        xj, xt = jnp.asarray(x), torch.from_numpy(x)
        a = median_ms(lambda: xla_tied(xj, e).block_until_ready())  # noqa: B023
        a2 = median_ms(lambda: xla_transposed(xj, et).block_until_ready())  # noqa: B023
        b = median_ms(lambda: xt @ te.T)  # noqa: B023
        b2 = median_ms(lambda: xt @ tet)  # noqa: B023
        gflop = 2 * rows * D_MODEL * VOCAB / 1e9
        print(f"rows {rows}: xla x@E.T {a:.2f} ms ({gflop / a * 1e3:.0f} GF/s), "
              f"xla x@Et {a2:.2f}, torch x@E.T {b:.2f} ({gflop / b * 1e3:.0f} GF/s), "
              f"torch x@Et {b2:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
