"""Weight-only and dynamic int8 against float32 for one decoding step's matrix products on
XLA:CPU (the opus-mt-size Marian of bench.hf_generate), alone, in bench.skinny_products'
jitted while loop. Written for issue #28's `hf.load(path, quantize="int8")` question: would
int8 weights make XLA:CPU's decode step faster?

    python bench/results/int8_products/int8_products.py --json OUT.json [--rows 1,4,8,32]

Forms (per product, weights per output channel as flax_transformer/export/int8.py stores them):
- f32: x @ w (float32 weights; what the project runs now);
- w8_deq: x @ (int8 values -> f32 * scale): the export's Int8Matrix.dequantize next to the dot;
- w8_post: (x @ (int8 values -> f32)) * scale: the scale moved after the product;
- w8a8: x quantised per row to int8, an int8 x int8 -> int32 dot, both scales after;
- bf16: bf16 weights and activations, float32 result (half the bytes, for comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.skinny_products import D_FF, D_MODEL, LAYERS, VOCAB, _loop, _weights  # noqa: E402

FORMS = ("f32", "w8_deq", "w8_post", "w8a8", "bf16")


def quantize(w, reduce_axis):
    scale = jnp.max(jnp.abs(w), axis=reduce_axis, keepdims=True) / 127
    return jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8), scale


def prepare(form, table, decoder):
    """(table, decoder) in the form's storage: arrays, or (int8 values, scale) pairs."""
    square, up, down = decoder
    if form == "f32":
        return table, decoder
    if form == "bf16":
        cast = lambda w: w.astype(jnp.bfloat16)  # noqa: E731
        return cast(table), (
            [cast(w) for w in square],
            [cast(w) for w in up],
            [cast(w) for w in down],
        )
    q = lambda w: quantize(w, 0)  # noqa: E731  (in, out) kernels: one scale per column
    return quantize(table, 1), ([q(w) for w in square], [q(w) for w in up], [q(w) for w in down])


def product(form, x, w):
    """x (rows, in) @ kernel (in, out) in the form."""
    if form == "f32":
        return x @ w
    if form == "bf16":
        return (x.astype(jnp.bfloat16) @ w).astype(jnp.float32)
    values, scale = w
    if form == "w8_deq":
        return x @ (values.astype(jnp.float32) * scale)
    if form == "w8_post":
        return (x @ values.astype(jnp.float32)) * scale
    sx = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / 127
    xq = jnp.clip(jnp.round(x / sx), -127, 127).astype(jnp.int8)
    acc = jax.lax.dot_general(xq, values, (((1,), (0,)), ((), ())),
                              preferred_element_type=jnp.int32)  # fmt: skip
    return acc.astype(jnp.float32) * sx * scale


def table_logits(form, table, x):
    """The tied output projection as nn/model.py runs it: table @ x for one row, x @ table.T
    for more; int8 forms keep one scale per table row (the export's layout)."""
    if form in ("f32", "bf16"):
        t = table
        xx = x.astype(t.dtype)
        out = (t @ xx[0])[None] if x.shape[0] == 1 else xx @ t.T
        return out.astype(jnp.float32)
    values, scale = table  # (vocab, d), (vocab, 1)
    if form == "w8_deq":
        t = values.astype(jnp.float32) * scale
        return (t @ x[0])[None] if x.shape[0] == 1 else x @ t.T
    if form == "w8_post":
        t = values.astype(jnp.float32)
        out = (t @ x[0])[None] if x.shape[0] == 1 else x @ t.T
        return out * scale[:, 0]
    sx = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / 127
    xq = jnp.clip(jnp.round(x / sx), -127, 127).astype(jnp.int8)
    acc = jax.lax.dot_general(xq, values, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.int32)  # fmt: skip
    return acc.astype(jnp.float32) * sx * scale[:, 0]


def output_step(form):
    def step(table, x):
        logits = table_logits(form, table, x)
        return x + jnp.max(logits, axis=-1, keepdims=True) * 1e-3

    return step


def decoder_step(form):
    def step(weights, x):
        square, up, down = weights
        for layer in range(LAYERS):
            for w in square[6 * layer : 6 * layer + 6]:
                x = jnp.tanh(product(form, x, w))
            x = jnp.tanh(product(form, jax.nn.silu(product(form, x, up[layer])), down[layer]))
        return x

    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--rows", default="1,4,8,32")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    table, decoder = _weights()
    stored = {form: prepare(form, table, decoder) for form in FORMS}
    loops = {}
    for form in FORMS:
        for part, make in (("output", output_step), ("decoder", decoder_step)):
            for rows in rows_list:
                weights = stored[form][0] if part == "output" else stored[form][1]
                loops[(form, part, rows)] = (_loop(make(form), args.steps), weights)
    inputs = {r: jnp.full((r, D_MODEL), 0.1, jnp.float32) for r in rows_list}
    for (_, _, rows), (loop, weights) in loops.items():  # compile
        loop(weights, inputs[rows]).block_until_ready()
    best = {key: float("inf") for key in loops}
    for _ in range(args.rounds):  # interleaved: every form, part and row count per round
        for key, (loop, weights) in loops.items():
            start = time.perf_counter()
            loop(weights, inputs[key[2]]).block_until_ready()
            best[key] = min(best[key], (time.perf_counter() - start) / args.steps)
    cells = [{"form": f, "part": p, "rows": r, "ms_per_step": round(s * 1e3, 3)}
             for (f, p, r), s in best.items()]  # fmt: skip
    result = {"cells": cells, "loadavg_end": os.getloadavg(), "argv": argv or sys.argv[1:],
              "sizes": {"vocab": VOCAB, "d_model": D_MODEL, "d_ff": D_FF, "layers": LAYERS},
              "jax": jax.__version__}  # fmt: skip
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print("| part | rows | " + " | ".join(f"{f} ms" for f in FORMS) + " |")
    print("|---|---|" + "---|" * len(FORMS))
    for part in ("output", "decoder"):
        for rows in rows_list:
            row = [f"{best[(f, part, rows)] * 1e3:.2f}" for f in FORMS]
            print(f"| {part} | {rows} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
