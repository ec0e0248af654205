"""What an int8 product with weights packed once costs on this CPU, against XLA:CPU's.

    python bench/results/decode_limits/prepacked_int8.py [--rows 32] [--rounds 3]

The products of one opus-mt-size decode step (6 layers x (six 512 x 512, 512 x 2048,
2048 x 512) and the 512 x 58101 output table; each weight its own buffer), `rows` rows:
- xla: int8 x int8 -> int32 as nn.int8_products computes them (YNNPACK packs each weight
  inside every call), in a jitted fori_loop of 10 steps, each result requantised into the
  next product's input;
- torch_prepacked: PyTorch's dynamic int8 Linear (torch.ao.nn.quantized.dynamic, the "x86"
  engine: fbgemm / oneDNN with weights packed once at construction), the same chain in a
  Python loop of 10 steps (its per-call dispatch counted against it).
ms per step, the two alternated `rounds` times, medians of 5 per round. torch runs on as many
threads as the machine has cores, XLA on its own pool of the same size.
"""

import argparse
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

warnings.filterwarnings("ignore", category=UserWarning)  # torch's quantised-tensor notice
SHAPES = ([(512, 512)] * 6 + [(512, 2048), (2048, 512)]) * 6 + [(512, 58101)]
STEPS = 10


def xla_chain(rows: int):
    rng = np.random.default_rng(0)
    weights = [jnp.asarray(rng.integers(-127, 127, (k, n)), jnp.int8) for k, n in SHAPES]

    def next_input(y, k):
        y = y[:, :k] if y.shape[1] >= k else jnp.tile(y, (1, k // y.shape[1]))
        return jnp.clip(jnp.round(y * 1e-4), -127, 127).astype(jnp.int8)

    def step(x, ws):
        for w, (k, _) in zip(ws, SHAPES, strict=True):
            acc = jax.lax.dot_general(
                next_input(x, k), w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32
            )
            x = acc.astype(jnp.float32) * 1.5
        return x[:, :512]

    run = jax.jit(lambda x, ws: jax.lax.fori_loop(0, STEPS, lambda _, c: step(c, ws), x))
    x = jnp.asarray(rng.standard_normal((rows, 512)), jnp.float32)
    jax.block_until_ready(run(x, weights))
    return lambda: jax.block_until_ready(run(x, weights))


def torch_chain(rows: int):
    from torch.ao.nn.quantized.dynamic import Linear

    torch.manual_seed(0)
    layers = []
    for k, n in SHAPES:
        layer = Linear(k, n)
        dense = torch.nn.Linear(k, n)
        layer.set_weight_bias(
            torch.quantize_per_channel(
                dense.weight.detach(), dense.weight.abs().amax(1) / 127, torch.zeros(n), 0,
                torch.qint8,
            ),
            None,
        )  # fmt: skip
        layers.append(layer)
    x0 = torch.randn(rows, 512)

    def run():
        with torch.inference_mode():
            x = x0
            for _ in range(STEPS):
                for layer, (k, _) in zip(layers, SHAPES, strict=True):
                    x = x[:, :k] if x.shape[1] >= k else x.repeat(1, k // x.shape[1])
                    x = layer(x.contiguous())
                x = x[:, :512]
        return x

    run()
    return run


def median_ms(fn) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / STEPS)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    sides = {"xla": xla_chain(args.rows), "torch_prepacked": torch_chain(args.rows)}
    print(f"{args.rows} rows, torch engine {torch.backends.quantized.engine}", flush=True)
    for r in range(args.rounds):
        ms = {name: median_ms(fn) for name, fn in sides.items()}
        print(
            f"round {r + 1}: xla {ms['xla']:.2f} ms, torch prepacked "
            f"{ms['torch_prepacked']:.2f} ms a step ({ms['xla'] / ms['torch_prepacked']:.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
