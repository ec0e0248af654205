"""The train step's matrix products alone: XLA:CPU (jitted jnp) against torch, and what they
add up to per step.

    python -m bench.step_gemms [--d-model 256 --d-ff 1024 --heads 4 --layers 3 --vocab 1000]
        [--batch 32 --len 64] [--repeats 9] [--threads N] [--json OUT.json]
    taskset -c 0 python -m bench.step_gemms --threads 1 ...   # one core each: kernel quality

Every product of one training step of the seq2seq model (encoder and decoder `--layers`
each, source and target `--len` tokens, `--batch` rows) in the forms the step computes: for
a dense layer x (rows, k) @ W (k, n) the forward, the input gradient g @ W^T and the weight
gradient x^T @ g; for attention the batched scores q k^T ((batch * heads, len, head_dim) x
(.., head_dim, len)) and weights @ v, which stand for the backward's products of their
shapes. Each product is timed interleaved (JAX then torch, `--repeats` times); the medians
give each side's GFLOP/s and, times the product's count in a step, the time the step's
products alone take on each side: a floor under the step that no change around the products
can go below (also from each product's fastest repeat: on a shared machine the closest to
its quiet speed). float32, torch on all cores unless --threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def step_products(d: int, f: int, vocab: int, layers: int) -> list[tuple[str, int, int, int]]:
    """(name, k, n, count per step) of the dense products x (rows, k) @ W (k, n): per encoder
    layer q/k/v/out, per decoder layer self q/k/v/out and cross q/k/v/out, one ffn up and
    down each, and the output layer."""
    return [
        ("d x d (attention q/k/v/out)", d, d, 4 * layers + 8 * layers),
        ("d x d_ff (ffn up)", d, f, 2 * layers),
        ("d_ff x d (ffn down)", f, d, 2 * layers),
        ("d x vocab (output layer)", d, vocab, 1),
    ]


def products(args) -> list[dict]:
    """[{name, form, flops, count, jax: fn, torch: fn}] with the operands made."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    rng = np.random.default_rng(0)

    def arrays(*shape):
        value = rng.standard_normal(shape, dtype=np.float32)
        return jnp.asarray(value), torch.from_numpy(value.copy())

    dot = jax.jit(jnp.matmul)
    dot_tn = jax.jit(lambda a, b: a.T @ b)  # x^T g
    dot_nt = jax.jit(lambda a, b: a @ b.T)  # g W^T
    out = []
    rows = args.batch * args.len
    for name, k, n, count in step_products(args.d_model, args.d_ff, args.vocab, args.layers):
        (jx, tx), (jw, tw), (jg, tg) = arrays(rows, k), arrays(k, n), arrays(rows, n)
        common = dict(name=name, flops=2 * rows * k * n, count=count)
        out += [
            dict(
                common,
                form="x @ W",
                jax=lambda a=jx, b=jw: dot(a, b),
                torch=lambda a=tx, b=tw: a @ b,
            ),
            dict(
                common,
                form="g @ W^T",
                jax=lambda a=jg, b=jw: dot_nt(a, b),
                torch=lambda a=tg, b=tw: a @ b.T,
            ),
            dict(
                common,
                form="x^T @ g",
                jax=lambda a=jx, b=jg: dot_tn(a, b),
                torch=lambda a=tx, b=tg: a.T @ b,
            ),
        ]
    bh, length, dh = args.batch * args.heads, args.len, args.d_model // args.heads
    (jq, tq), (jk, tk), (jp, tp) = (
        arrays(bh, length, dh),
        arrays(bh, length, dh),
        arrays(bh, length, length),
    )
    scores = jax.jit(lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k))
    # Per attention call (encoder self, decoder self, cross: 3 per layer pair): q k^T and the
    # weights' gradient dO v^T have the scores' form; p v, dq = ds k, dk = ds^T q, dv = p^T dO
    # the (len, len) x (len, head_dim) one.
    calls = 3 * args.layers
    common = dict(name=f"attention ({bh}, {length}, {length}, {dh})", flops=2 * bh * length**2 * dh)
    out += [
        dict(
            common,
            form="q @ k^T",
            count=2 * calls,
            jax=lambda: scores(jq, jk),
            torch=lambda: torch.bmm(tq, tk.transpose(1, 2)),
        ),
        dict(
            common,
            form="p @ v",
            count=4 * calls,
            jax=lambda: dot(jp, jk),
            torch=lambda: torch.bmm(tp, tk),
        ),
    ]
    return out


def time_pair(product: dict, repeats: int) -> dict:
    import jax

    def run_jax():
        return jax.block_until_ready(product["jax"]())

    run_jax()
    product["torch"]()
    times = {"jax": [], "torch": []}
    for _ in range(repeats):
        for side, fn in (("jax", run_jax), ("torch", product["torch"])):
            start = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - start)
    medians = {side: statistics.median(ts) for side, ts in times.items()}
    best = {side: min(ts) for side, ts in times.items()}
    return {
        "name": product["name"],
        "form": product["form"],
        "count": product["count"],
        "gflop": product["flops"] / 1e9,
        "jax_ms": medians["jax"] * 1e3,
        "torch_ms": medians["torch"] * 1e3,
        "jax_best_ms": best["jax"] * 1e3,
        "torch_best_ms": best["torch"] * 1e3,
        "jax_gflops": product["flops"] / medians["jax"] / 1e9,
        "torch_gflops": product["flops"] / medians["torch"] / 1e9,
    }


def step_floor(rows: list[dict], stat: str = "") -> dict[str, float]:
    """Each side's products of one step, ms: every product's median (stat "_best": fastest)
    time times its count."""
    return {
        "jax": sum(r["count"] * r[f"jax{stat}_ms"] for r in rows),
        "torch": sum(r["count"] * r[f"torch{stat}_ms"] for r in rows),
        "gflop": sum(r["count"] * r["gflop"] for r in rows),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default, text in (
        ("d-model", 256, "model width"),
        ("d-ff", 1024, "feed-forward width"),
        ("heads", 4, "attention heads"),
        ("layers", 3, "encoder and decoder layers each"),
        ("vocab", 1000, "output vocabulary"),
        ("batch", 32, "sequences per step"),
        ("len", 64, "source and target tokens per sequence"),
        ("repeats", 9, "timed repeats of each product per side"),
        ("threads", os.cpu_count() or 1, "torch threads (XLA: pin the process, e.g. taskset)"),
    ):
        parser.add_argument(f"--{name}", type=int, default=default, help=text)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    names = ("d_model", "d_ff", "heads", "layers", "vocab", "batch", "len", "repeats", "threads")
    for name in names:
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from bench.ct2_peer import cpu_info, describe_cpu

    cpu = cpu_info()
    print(describe_cpu(cpu))
    load_start = os.getloadavg()[0]
    rows = [time_pair(p, args.repeats) for p in products(args)]
    floor, best = step_floor(rows), step_floor(rows, "_best")
    print("| product | form | per step | XLA GFLOP/s | torch GFLOP/s | XLA / torch |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["jax_gflops"] / r["torch_gflops"]
        print(
            f"| {r['name']} | {r['form']} | {r['count']} | {r['jax_gflops']:.0f} | "
            f"{r['torch_gflops']:.0f} | {ratio:.2f} |"
        )
    load_end = os.getloadavg()[0]
    print(
        f"the step's products ({floor['gflop']:.1f} GFLOP): XLA {floor['jax']:.0f} ms, "
        f"torch {floor['torch']:.0f} ms (medians); fastest repeats: XLA {best['jax']:.0f} ms, "
        f"torch {best['torch']:.0f} ms; load average {load_start:.2f} -> {load_end:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "loadavg": [load_start, load_end],
            "cpu": cpu,
            "products": rows,
            "step_products_ms": floor,
            "step_products_best_ms": best,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
