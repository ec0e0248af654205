"""What one decoding step's matrix products cost on XLA:CPU for a few rows.

    python -m bench.skinny_products --json OUT.json [--rows 1,2,4,8,32] [--rounds 3]

A decoding step of the opus-mt-size Marian model (bench.hf_generate) multiplies `rows`
hidden states (batch x beams) by every decoder weight and by the 58101 x 512 output table.
This times those products alone, inside a jitted lax.while_loop of `--steps` iterations (as
generate runs them), float32, at each row count, interleaved over the rounds (best kept):
- output: the tied output projection, embedding @ x for one row and x @ embedding.T for more
  (what nn/model.py runs), 119 MB;
- decoder: the 48 products of 6 decoder layers (self-attention q, k, v, out; cross-attention
  q, out; the two feed-forward maps), 88 MB, one after another with a tanh between.
GB/s = the weight bytes / time: a product that streams its weights at the matvec bandwidth
of bench.hf_generate's floor would match `matvec_gb_s`, timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

VOCAB, D_MODEL, D_FF, LAYERS = 58101, 512, 2048, 6


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--rows", default="1,2,4,8,32", help="row counts, comma-separated")
    parser.add_argument("--steps", type=int, default=32, help="loop iterations per timing")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (best kept)")
    args = parser.parse_args(argv)
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if min(args.rows) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--rows, --steps and --rounds must be >= 1")
    return args


def _weights():
    import jax

    key = jax.random.key(0)
    normal = lambda i, shape: jax.random.normal(jax.random.fold_in(key, i), shape) * 0.02  # noqa: E731
    table = normal(0, (VOCAB, D_MODEL))
    square = [normal(1 + i, (D_MODEL, D_MODEL)) for i in range(6 * LAYERS)]
    up = [normal(100 + i, (D_MODEL, D_FF)) for i in range(LAYERS)]
    down = [normal(200 + i, (D_FF, D_MODEL)) for i in range(LAYERS)]
    return table, (square, up, down)


def _loop(step, steps: int):
    """jit(weights, x0) -> x after `steps` iterations of x = step(weights, x)."""
    import jax

    def run(weights, x0):
        body = lambda c: (c[0] + 1, step(weights, c[1]))  # noqa: E731
        return jax.lax.while_loop(lambda c: c[0] < steps, body, (0, x0))[1]

    return jax.jit(run)


def output_step(table, x):
    import jax.numpy as jnp

    logits = (table @ x[0])[None] if x.shape[0] == 1 else x @ table.T
    return x + jnp.max(logits, axis=-1, keepdims=True) * 1e-3  # every logit is used


def decoder_step(weights, x):
    import jax
    import jax.numpy as jnp

    square, up, down = weights
    for layer in range(LAYERS):
        for w in square[6 * layer : 6 * layer + 6]:
            x = jnp.tanh(x @ w)
        x = jnp.tanh(jax.nn.silu(x @ up[layer]) @ down[layer])
    return x


def run(args, argv: list[str]) -> dict:
    import jax
    import jax.numpy as jnp

    from bench.hf_generate import matvec_bandwidth

    table, decoder = _weights()
    parts = {
        "output": (output_step, table, table.size * 4),
        "decoder": (decoder_step, decoder, sum(w.size for w in jax.tree.leaves(decoder)) * 4),
    }
    loops = {(name, rows): _loop(step, args.steps) for name, (step, *_) in parts.items()
             for rows in args.rows}  # fmt: skip
    inputs = {rows: jnp.full((rows, D_MODEL), 0.1, jnp.float32) for rows in args.rows}
    for (name, rows), loop in loops.items():  # compile
        loop(parts[name][1], inputs[rows]).block_until_ready()
    best = {key: float("inf") for key in loops}
    for _ in range(args.rounds):
        for (name, rows), loop in loops.items():
            start = time.perf_counter()
            loop(parts[name][1], inputs[rows]).block_until_ready()
            best[(name, rows)] = min(best[(name, rows)], (time.perf_counter() - start) / args.steps)
    cells = [
        {
            "part": name,
            "rows": rows,
            "ms_per_step": round(seconds * 1e3, 3),
            "weight_bytes": parts[name][2],
            "gb_s": round(parts[name][2] / seconds / 1e9, 2),
        }
        for (name, rows), seconds in best.items()
    ]
    machine = {
        "command": " ".join(["python", "-m", "bench.skinny_products", *argv]),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "loadavg_end": os.getloadavg(),
        "matvec_gb_s": round(matvec_bandwidth(20), 2),
        "steps": args.steps,
        "rounds": args.rounds,
    }
    return {"cells": cells, "machine": machine}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    result = run(args, argv)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"matvec bandwidth {result['machine']['matvec_gb_s']} GB/s")
    print("| part | rows | ms per step | GB/s |")
    print("|---|---|---|---|")
    for c in result["cells"]:
        print(f"| {c['part']} | {c['rows']} | {c['ms_per_step']:.2f} | {c['gb_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
