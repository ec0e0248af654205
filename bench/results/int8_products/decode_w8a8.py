"""Prototype, not an API: the opus-mt-size Marian of bench.hf_generate decoded by this project
with dynamic int8 matrix products (weights int8 per output channel, activations quantised to
int8 per row at run time, int8 x int8 -> int32 dot, both scales after), timed interleaved
against the project's float32 and CTranslate2 int8, same cells as bench.hf_generate.

    python bench/results/int8_products/decode_w8a8.py --json OUT.json [--rounds 3]

The int8 weights are flax_transformer/export/int8.py's `quantize_variables` (Dense kernels one
scale per column, the tied embedding one scale per row). The model code is not changed: flax
method interceptors route Dense.__call__ and nn.Embed.__call__/attend to int8 code when their
parameter is an Int8Matrix, and the one-row tied-logits helper is replaced. One row (batch 1
greedy) is padded with zero rows to 4 before the int8 product: an int8 product of one row
was slower than float32 on XLA:CPU, one padded to 2-4 rows 1.5x faster (int8_products.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import ct2_peer  # noqa: E402
from bench.hf_generate import OPUS_MT, TINY, make_checkpoint  # noqa: E402
from flax_transformer import hf  # noqa: E402
from flax_transformer.export.int8 import Int8Matrix, quantize_variables  # noqa: E402
from flax_transformer.nn import layers as layers_mod  # noqa: E402
from flax_transformer.nn import model as model_mod  # noqa: E402

MIN_ROWS = 4  # fewer rows are padded with zeros (int8_products: 1 row padded to 2-4 is fastest)


def _quantize_rows(x):
    sx = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / 127
    return jnp.clip(jnp.round(x / sx), -127, 127).astype(jnp.int8), sx


def w8a8(rows, values, contract_axis: int):
    """rows (n, in) float32 times int8 `values` contracted on its `contract_axis` -> int32
    accumulators as float32 times the rows' scales (the weight scales are applied by the
    caller)."""
    n = rows.shape[0]
    if n < MIN_ROWS:  # XLA:CPU's int8 product of 1 row is slow; 2-4 rows are fast
        rows = jnp.concatenate([rows, jnp.zeros((MIN_ROWS - n, rows.shape[1]), rows.dtype)])
    xq, sx = _quantize_rows(rows)
    acc = jax.lax.dot_general(xq, values, (((1,), (contract_axis,)), ((), ())),
                              preferred_element_type=jnp.int32)  # fmt: skip
    return (acc.astype(jnp.float32) * sx)[:n]


def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, layers_mod.Dense) and context.method_name == "__call__":
        kernel = module.get_variable("params", "kernel")
        if isinstance(kernel, Int8Matrix):
            (x,) = args
            rows = x.reshape(-1, x.shape[-1])
            y = w8a8(rows, kernel.values, 0) * kernel.scale
            y = y.reshape(x.shape[:-1] + (module.features,))
            return y + module.get_variable("params", "bias") if module.use_bias else y
    if isinstance(module, nn.Embed) and context.method_name in ("__call__", "attend"):
        table = module.get_variable("params", "embedding")
        if isinstance(table, Int8Matrix):
            (x,) = args
            if context.method_name == "__call__":  # a lookup: the rows, dequantised
                return jnp.take(table.values, x, axis=0).astype(jnp.float32) * jnp.take(
                    table.scale, x, axis=0
                )
            rows = x.reshape(-1, x.shape[-1])
            y = w8a8(rows, table.values, 1) * table.scale[:, 0]
            return y.reshape(x.shape[:-1] + (table.values.shape[0],))
    return next_fun(*args, **kwargs)


_original_one_row = model_mod._tied_logits_one_row


def tied_logits_one_row(embed, x):
    table = embed.embedding
    if not isinstance(table, Int8Matrix):
        return _original_one_row(embed, x)
    y = w8a8(x.reshape(1, -1), table.values, 1) * table.scale[:, 0]
    return y.reshape(x.shape[:-1] + (table.values.shape[0],))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--min-rows", type=int, default=MIN_ROWS, help="pad fewer rows to this")
    args = parser.parse_args(argv)
    globals()["MIN_ROWS"] = args.min_rows
    model_mod._tied_logits_one_row = tied_logits_one_row
    sizes = TINY if args.quick else OPUS_MT
    src_len, new_tokens = (8, 4) if args.quick else (32, 64)
    cells = [(1, 1), (2, 2)] if args.quick else [(1, 1), (1, 4), (8, 1), (8, 4)]
    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), sizes)
        f32 = hf.load(tmp)
        peers, why = ct2_peer.load_peers(tmp, sizes, threads)
    q8 = hf.HFModel(**{**f32.__dict__, "variables": quantize_variables(f32.variables)})
    sources = np.random.default_rng(0).integers(1, sizes["vocab_size"] - 1, (8, src_len))

    def project(model):
        def call(batch, beams):
            ids = sources[:batch]
            with nn.intercept_methods(interceptor):
                return model.generate(
                    ids, np.ones_like(ids), num_beams=beams,
                    max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                )  # fmt: skip

        return call

    sides = {"project_f32": project(f32), "project_w8a8": project(q8)}
    if "ct2_int8" in peers:
        sides["ct2_int8"] = lambda b, k: peers["ct2_int8"].generate(sources[:b], k, new_tokens)
    for cell in cells:
        for call in sides.values():
            call(*cell)
    times = {cell: {side: [] for side in sides} for cell in cells}
    agree = {cell: [] for cell in cells}
    for r in range(args.rounds):
        for cell in cells:
            out = {}
            for side, call in sides.items():
                start = time.perf_counter()
                out[side] = call(*cell)
                times[cell][side].append(time.perf_counter() - start)
            agree[cell].append(float(np.mean(out["project_f32"] == out["project_w8a8"])))
            print(r, cell, {s: round(t[-1], 2) for s, t in times[cell].items()}, flush=True)
    rows = []
    for batch, beams in cells:
        row = {"batch": batch, "num_beams": beams}
        for side, samples in times[(batch, beams)].items():
            row[f"{side}_tok_s"] = round(batch * new_tokens / statistics.median(samples), 2)
        row["w8a8_same_as_f32"] = min(agree[(batch, beams)])
        rows.append(row)
    result = {"cells": rows, "ct2_skipped": why, "loadavg_end": os.getloadavg(),
              "argv": argv or sys.argv[1:], "jax": jax.__version__,
              "min_rows": MIN_ROWS}  # fmt: skip
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(
        "| batch | beams | project f32 | project w8a8 | CT2 int8 | w8a8 / f32 | w8a8 / CT2 int8 |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in rows:
        ct2 = c.get("ct2_int8_tok_s")
        print(f"| {c['batch']} | {c['num_beams']} | {c['project_f32_tok_s']} | "
              f"{c['project_w8a8_tok_s']} | {ct2} | "
              f"{c['project_w8a8_tok_s'] / c['project_f32_tok_s']:.2f}x | "
              f"{(c['project_w8a8_tok_s'] / ct2) if ct2 else float('nan'):.2f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
