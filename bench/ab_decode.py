"""A/B of decoding in two source trees, paired per cell: tokens/s of each and their ratio.

    python -m bench.ab_decode BASE_TREE AFTER_TREE --pairs 5 --json OUT.json

What it measures: eight decoding cells, the four of bench.hf_generate (a random opus-mt-size
Marian, 32 source tokens -> 64 new tokens, batch 1 and 8, greedy and beam 4, through
`hf.load(...).generate`) and four of bench.decode (the `reference` preset through
`decoding.generate`: greedy with the KV cache at 32 and 128 new tokens, without it at 32, beam
4 at 32). One long-lived worker process per tree (that tree first on PYTHONPATH, so its own
`flax_transformer`) compiles every cell once; then each pair times every cell once in each tree,
the order alternating (base first in even pairs, after first in odd ones), so a load change
hits both sides of a pair alike. Reported per cell: each tree's median tokens/s, the median of
the per-pair ratios after / base (> 1: after is faster) with its min and max, and whether the
two trees' tokens agreed in every pair. It measured the one decoding engine against the code
before it (docs/decoding.md, bench/NOTES.md "The compiled program first"); it was
bench/results/engine_ab/ab_pairs.py and ab_worker.py until 2026-11-28.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CELLS = {  # name -> tokens made per call
    "hf b1 greedy": 64, "hf b1 beam4": 64, "hf b8 greedy": 8 * 64, "hf b8 beam4": 8 * 64,
    "decode cached 32": 32, "decode cached 128": 128, "decode uncached 32": 32,
    "decode beam4 32": 32,
}  # fmt: skip

# Runs in the tree under test (python -c WORKER CHECKPOINT): compiles every cell, prints
# "ready", then answers each cell name on stdin with "seconds checksum" (of the tokens).
WORKER = r"""
import sys, time, zlib
import numpy as np
import jax
from flax_transformer import Transformer, hf
from flax_transformer.decoding import Beam, Greedy, generate
from flax_transformer.nn.kinds import abstract_variables
from flax_transformer.spec.presets import preset

marian = hf.load(sys.argv[1])
rng = np.random.default_rng(0)
sources = rng.integers(1, 58100, (8, 32))

def hf_cell(batch, beams):
    ids = sources[:batch]
    return lambda: marian.generate(
        ids, np.ones_like(ids), num_beams=beams, max_new_tokens=64, min_new_tokens=64)

config = preset("reference", dropout_rate=0.0, max_len=512)  # bench.decode's model
model = Transformer(config)
params = jax.tree.map(
    lambda s: rng.normal(0.0, 0.05, s.shape).astype(s.dtype), abstract_variables(model))
src = rng.integers(3, config.src_vocab_size, (1, 32)).astype(np.int32)

def decode_cell(strategy, n_new, use_cache=True):
    def call():
        out = generate(model, params, src, strategy, max_new_tokens=n_new, bos_id=1,
                       eos_id=None, use_cache=use_cache)
        return np.asarray(out[0] if isinstance(out, tuple) else out)
    return call

cells = {
    "hf b1 greedy": hf_cell(1, 1), "hf b1 beam4": hf_cell(1, 4),
    "hf b8 greedy": hf_cell(8, 1), "hf b8 beam4": hf_cell(8, 4),
    "decode cached 32": decode_cell(Greedy(), 32),
    "decode cached 128": decode_cell(Greedy(), 128),
    "decode uncached 32": decode_cell(Greedy(), 32, use_cache=False),
    "decode beam4 32": decode_cell(Beam(4, 0.6), 32),
}
for call in cells.values():  # compile, then one warm run
    call()
    call()
print("ready", flush=True)
for line in sys.stdin:
    call = cells[line.strip()]
    start = time.perf_counter()
    tokens = np.asarray(call())
    seconds = time.perf_counter() - start
    print(f"{seconds:.6f} {zlib.crc32(tokens.astype(np.int64).tobytes())}", flush=True)
"""


def start_worker(tree: Path, checkpoint: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, checkpoint],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def ask(worker: subprocess.Popen, cell: str) -> tuple[float, str]:
    worker.stdin.write(cell + "\n")
    worker.stdin.flush()
    seconds, checksum = worker.stdout.readline().split()
    return float(seconds), checksum


def run(trees: dict[str, Path], pairs: int) -> dict:
    """Both workers started one at a time (compiling), then `pairs` alternating rounds."""
    from bench.hf_generate import OPUS_MT, make_checkpoint

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), OPUS_MT)
        workers = {}
        for side, tree in trees.items():
            workers[side] = start_worker(tree, tmp)
            if workers[side].stdout.readline().strip() != "ready":
                raise SystemExit(f"bench.ab_decode: the {side} worker ({tree}) did not start")
        load_timed = os.getloadavg()
        times = {cell: {"base": [], "after": []} for cell in CELLS}
        same = dict.fromkeys(CELLS, True)
        for pair in range(pairs):
            order = ("base", "after") if pair % 2 == 0 else ("after", "base")
            for cell in CELLS:
                sums = {}
                for side in order:
                    seconds, sums[side] = ask(workers[side], cell)
                    times[cell][side].append(seconds)
                same[cell] &= sums["base"] == sums["after"]
            print(f"pair {pair + 1}/{pairs} done, load {os.getloadavg()}", flush=True)
        for worker in workers.values():
            worker.stdin.close()
            worker.wait()
    result = {"pairs": pairs, "load_start": load_start, "load_timed_start": load_timed,
              "load_end": os.getloadavg(), "cpu_count": os.cpu_count(), "cells": []}  # fmt: skip
    for cell, n_tokens in CELLS.items():
        base, after = times[cell]["base"], times[cell]["after"]
        ratios = [b / a for b, a in zip(base, after, strict=True)]
        result["cells"].append({
            "cell": cell, "base_tok_s": n_tokens / statistics.median(base),
            "after_tok_s": n_tokens / statistics.median(after),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "same_tokens": same[cell],
            "base_s": base, "after_s": after,
        })  # fmt: skip
    return result


def table(result: dict) -> str:
    lines = ["| cell | before tok/s | after tok/s | after/before, median of pairs (min-max) | "
             "same tokens |", "|---|---:|---:|---:|:---:|"]  # fmt: skip
    for c in result["cells"]:
        lines.append(
            f"| {c['cell']} | {c['base_tok_s']:.1f} | {c['after_tok_s']:.1f} | "
            f"{c['ratio_median']:.2f}x ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) | "
            f"{'yes' if c['same_tokens'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab_decode", description=__doc__.splitlines()[0]
    )
    parser.add_argument("base", type=Path, help="the source tree before (a checkout)")
    parser.add_argument("after", type=Path, help="the source tree after (a checkout)")
    parser.add_argument("--pairs", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    args = parser.parse_args(argv)
    trees = {"base": args.base.resolve(), "after": args.after.resolve()}
    for side, tree in trees.items():
        if not (tree / "flax_transformer" / "__init__.py").is_file():
            parser.error(f"{side} {tree}: no flax_transformer/ there")
    if args.pairs <= 0:
        parser.error("--pairs must be positive")
    result = run(trees, args.pairs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
