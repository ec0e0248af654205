"""int8 x int8 -> int32 products on XLA:CPU: where the weight operand sits, and what that costs.

    python bench/results/decode_limits/int8_products.py [--rows 32]

YNNPACK (XLA:CPU's library for these dots) packs the right-hand operand, the weights, into its
tile layout inside every call: `perf record` of a decode shows ynn::transpose_x32 (a (N, K)
table) and ynn::interleave4_x8 (a (K, N) kernel) beside the AMX dot kernel. Timed here, in
jitted fori_loops of 16 (single products) or 10 (the chain) iterations, median of 7 / 5:
- one product of each decode shape, the weights as the right-hand operand (as
  nn.int8_products computes: a Dense kernel (in, out) contracted on axis 0, the output table
  (vocab, in) on axis 1), and as the left-hand operand ((out, in) @ x.T, result transposed);
- the chain of a decode step's products (6 layers x (6 of 512 x 512, 512 x 2048, 2048 x 512)
  and the 512 x 58101 table), each weight a separate buffer, each result requantised into the
  next product's input, in both forms;
- the table as a compile-time constant (closed over) against an argument.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

I32 = jnp.int32
rng = np.random.default_rng(0)


def rhs(x, w, contract):  # x (M, K) . w, contracted on w's axis `contract`
    return jax.lax.dot_general(x, w, (((1,), (contract,)), ((), ())), preferred_element_type=I32)


def lhs(x, w):  # w (N, K) as the left operand: (N, M), transposed after a float epilogue
    acc = jax.lax.dot_general(w, x, (((1,), (1,)), ((), ())), preferred_element_type=I32)
    return (acc.astype(jnp.float32) * 1.5).T


def timed(fn, args, loops, repeats=7) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) / loops)
    return 1e3 * float(np.median(times))


def single(rows: int) -> None:
    def looped(product):
        def run(x, w):
            def body(_, c):  # a one-bit dependency keeps the product inside the loop
                return c + (product(c, w)[:, :1].astype(I32) & 1).astype(jnp.int8)

            return jax.lax.fori_loop(0, 16, body, x)

        return jax.jit(run)

    for k, n in [(512, 2048), (2048, 512), (512, 58101)]:
        w_kn = jnp.asarray(rng.integers(-127, 127, (k, n)), jnp.int8)
        w_nk = jnp.asarray(np.asarray(w_kn).T.copy())
        x = jnp.asarray(rng.integers(-127, 127, (rows, k)), jnp.int8)
        forms = {
            "rhs (K, N) kernel": (lambda c, w: rhs(c, w, 0), w_kn),
            "rhs (N, K) table": (lambda c, w: rhs(c, w, 1), w_nk),
            "lhs (N, K), out transposed": (lhs, w_nk),
        }
        for name, (product, w) in forms.items():
            ms = timed(looped(product), (x, w), 16)
            print(f"{k} x {n}, {rows} rows, {name:28s} {ms:.3f} ms", flush=True)


def chain(rows: int) -> None:
    shapes = [(512, 512)] * 6 + [(512, 2048), (2048, 512)]
    shapes = shapes * 6 + [(512, 58101)]
    weights = [rng.integers(-127, 127, (k, n)).astype(np.int8) for k, n in shapes]

    def next_input(y, k):  # float (M, N) -> int8 (M, k)
        y = y[:, :k] if y.shape[1] >= k else jnp.tile(y, (1, k // y.shape[1]))
        return jnp.clip(jnp.round(y * 1e-4), -127, 127).astype(jnp.int8)

    def step_rhs(x, ws):
        for w, (k, n) in zip(ws, shapes, strict=True):
            acc = rhs(next_input(x, k), w, 1 if n == 58101 else 0)
            x = acc.astype(jnp.float32) * 1.5
        return x[:, :512]

    def step_lhs(x, ws):
        for w, (k, _) in zip(ws, shapes, strict=True):
            x = lhs(next_input(x, k), w)
        return x[:, :512]

    rhs_ws = [jnp.asarray(w.T.copy() if w.shape[1] == 58101 else w) for w in weights]
    lhs_ws = [jnp.asarray(w.T.copy()) for w in weights]
    x = jnp.asarray(rng.standard_normal((rows, 512)), jnp.float32)
    for _ in range(2):
        for name, step, ws in [("rhs (as now)", step_rhs, rhs_ws), ("lhs", step_lhs, lhs_ws)]:

            def loop(x, ws, step=step):
                return jax.lax.fori_loop(0, 10, lambda _, c: step(c, ws), x)

            run = jax.jit(loop)
            ms = timed(run, (x, ws), 10, repeats=5)
            print(f"decode step's products, {rows} rows, {name:14s} {ms:.2f} ms", flush=True)


def constant_table(rows: int) -> None:
    table = rng.integers(-127, 127, (58101, 512)).astype(np.int8)
    x = jnp.asarray(rng.integers(-127, 127, (rows, 512)), jnp.int8)
    for constant in (False, True, False, True):

        def run(x, w, constant=constant):
            w = table if constant else w

            def body(_, c):
                return c + (rhs(c, w, 1)[:, :1] & 1).astype(jnp.int8)

            return jax.lax.fori_loop(0, 16, body, x)

        ms = timed(jax.jit(run), (x, jnp.asarray(table)), 16, repeats=3)
        print(f"table {'constant' if constant else 'argument'}: {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32)
    rows = parser.parse_args().rows
    single(rows)
    chain(rows)
    constant_table(rows)
