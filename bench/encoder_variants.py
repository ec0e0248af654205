"""Ways to run the project's float32 encoder forward, side by side in one process.

    python -m bench.encoder_variants [--model minilm|distilbert|roberta] [--cell 1x16 ...]
        [--rounds 10] [--json OUT.json] [--tiny]

What `hf.load(dir).forward` does is the baseline, `arguments`: the encoder jitted with the
parameters as arguments and hf.xla_cpu's compiler options. Beside it, each a change of one
thing: `constants` (the parameters closed over, so XLA compiles them into the program and
picks their layout), `einsum_attention` (attention's products as training runs them, einsums
over (batch, len, heads), instead of inference's heads first), `eigen_one_thread`
(xla_cpu_multi_thread_eigen off: the products on the calling thread), `fast_math`
(xla_cpu_enable_fast_math), and `packed_f32` (the products in kernels.f32_packed on weights
packed once, where that kernel runs). Same random checkpoint as
bench.encoder (transformers' save_pretrained, seed 0), random ids, every token real. Each
variant compiles and runs each cell once untimed, its output compared with the baseline's
(largest absolute difference); then every round times every variant, the order rotated each
round, a sample being the mean of back-to-back calls (>= 50 ms). Reported: min and median ms
per call, the ratio of medians to `arguments` (below 1: faster), and the compile time (the
first call). docs/benchmarks/encoder.md's variants (heads-first attention, the 1 x 16
tries) come from it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.encoder import MODELS, SAMPLE_SECONDS


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.encoder_variants")
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument("--cell", action="append", help="BATCHxTOKENS (repeatable; 1x16)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", help="where to write the results")
    parser.add_argument("--tiny", action="store_true", help="a toy-size model (smoke test)")
    args = parser.parse_args(argv)
    try:
        args.cells = [tuple(int(n) for n in c.split("x")) for c in args.cell or ["1x16"]]
    except ValueError:
        parser.error(f"--cell takes BATCHxTOKENS such as 1x16, got {args.cell}")
    if any(len(c) != 2 or min(c) < 1 for c in args.cells) or args.rounds < 1:
        parser.error("--cell takes BATCHxTOKENS of positive sizes; --rounds at least 1")
    return args


def training_layout(encode):
    """`encode` with attention's products laid out as in training (nn.attention: not
    deterministic, no dropout: the same values), while it is traced."""
    import functools

    from flax_transformer.nn import attention

    def traced(*args, **kwargs):
        original = attention.scaled_dot_product_attention

        @functools.wraps(original)
        def einsums(*a, **k):
            return original(*a, **{**k, "deterministic": False, "dropout_rate": 0.0})

        attention.scaled_dot_product_attention = einsums
        try:
            return encode(*args, **kwargs)
        finally:
            attention.scaled_dot_product_attention = original

    return traced


def make_variants(model) -> tuple[dict, list[str]]:
    """{name: encode(ids, mask) -> numpy}, and a line for each variant that cannot run here."""
    import flax.linen as nn
    import jax

    from flax_transformer.hf.xla_cpu import ENCODER_COMPILER_OPTIONS
    from flax_transformer.kernels.switches import KERNELS
    from flax_transformer.nn.f32_products import pack_for_products, packed_interceptor

    encode = model.encoder_fn()
    params = model.variables

    def with_options(**extra):
        jitted = jax.jit(
            lambda ids, mask, p: encode(ids, mask, params=p),
            compiler_options={**ENCODER_COMPILER_OPTIONS, **extra},
        )
        return lambda ids, mask: np.asarray(jitted(ids, mask, params))

    constants = jax.jit(encode, compiler_options=ENCODER_COMPILER_OPTIONS)
    einsums = jax.jit(
        lambda ids, mask, p: training_layout(encode)(ids, mask, params=p),
        compiler_options=ENCODER_COMPILER_OPTIONS,
    )
    variants = {
        "arguments": with_options(),
        "constants": lambda ids, mask: np.asarray(constants(ids, mask)),
        "einsum_attention": lambda ids, mask: np.asarray(einsums(ids, mask, params)),
        "eigen_one_thread": with_options(xla_cpu_multi_thread_eigen=False),
        "fast_math": with_options(xla_cpu_enable_fast_math=True),
    }
    skipped = []
    if KERNELS.f32.active():
        packed = pack_for_products(params)

        def encode_packed(ids, mask, p):
            with nn.intercept_methods(packed_interceptor):
                return encode(ids, mask, params=p)

        jitted = jax.jit(encode_packed, compiler_options=ENCODER_COMPILER_OPTIONS)
        variants["packed_f32"] = lambda ids, mask: np.asarray(jitted(ids, mask, packed))
    else:
        skipped.append(f"packed_f32 left out: {KERNELS.f32.reason_unavailable()}")
    return variants, skipped


def run(args, argv: list[str]) -> dict:
    from bench import encoder_peers
    from flax_transformer import hf

    architecture, full, tiny = MODELS[args.model]
    sizes = tiny if args.tiny else full
    rng = np.random.default_rng(0)
    inputs = {c: rng.integers(5, sizes["vocab_size"], c).astype(np.int32) for c in args.cells}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        encoder_peers.make_checkpoint(Path(tmp), architecture, sizes)
        variants, skipped = make_variants(hf.load(tmp))
    for line in skipped:
        print(line, file=sys.stderr, flush=True)
    cells = {}
    for cell, ids in inputs.items():
        mask = np.ones(cell, np.int32)
        first, outputs = {}, {}
        for name, call in variants.items():  # untimed: the compilation and first call
            start = time.perf_counter()
            outputs[name] = call(ids, mask)
            first[name] = time.perf_counter() - start
        calls = 1 if args.tiny else max(1, math.ceil(SAMPLE_SECONDS / min(first.values())))
        times = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                for _ in range(calls):
                    variants[name](ids, mask)
                times[name].append((time.perf_counter() - start) / calls)
        base = statistics.median(times["arguments"])
        cells["x".join(map(str, cell))] = {
            name: {
                "min_ms": min(t) * 1e3,
                "median_ms": statistics.median(t) * 1e3,
                "over_arguments": statistics.median(t) / base,
                "first_call_s": first[name],
                "max_abs_diff": float(np.abs(outputs[name] - outputs["arguments"]).max()),
            }
            for name, t in times.items()
        }
    import jax

    from bench import ct2_peer

    return {
        "machine": {
            "command": " ".join(["python", "-m", "bench.encoder_variants", *argv]),
            "cpu": ct2_peer.cpu_info(),
            "cpu_count": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "jax": jax.__version__,
        },
        "model": args.model,
        "rounds": args.rounds,
        "skipped": skipped,
        "cells": cells,
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    result = run(args, argv)
    for cell, found in result["cells"].items():
        print(f"{args.model} {cell}:")
        for name, r in found.items():
            print(
                f"  {name:17s} min {r['min_ms']:9.2f} ms  median {r['median_ms']:9.2f} ms  "
                f"{r['over_arguments']:.3f}x arguments  first call {r['first_call_s']:.1f} s  "
                f"diff {r['max_abs_diff']:.1e}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
