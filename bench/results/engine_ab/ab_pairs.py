"""Engine before/after, paired per cell: two long-lived workers, one per tree, timed in turn.

    python bench/results/engine_ab/ab_pairs.py BASE_TREE AFTER_TREE --pairs 5 --json OUT.json

Each worker (ab_worker.py, PYTHONPATH=its tree) compiles every cell once; then every pair times
each cell once in each tree, the order alternating (base first in even pairs, after first in
odd ones), so a load change hits both sides of a pair alike. Reported per cell: the median
seconds of each tree, tokens/s, and the median of the per-pair ratios after/base in tokens/s
(> 1: the engine is faster), with its min and max; same_tokens: the two trees' token checksums
agreed in every pair.
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

HERE = Path(__file__).resolve().parent
CELLS = {  # name -> tokens made per call
    "hf b1 greedy": 64, "hf b1 beam4": 64, "hf b8 greedy": 8 * 64, "hf b8 beam4": 8 * 64,
    "decode cached 32": 32, "decode cached 128": 128, "decode uncached 32": 32,
    "decode beam4 32": 32,
}  # fmt: skip


def start_worker(tree: str, checkpoint: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=tree)
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "ab_worker.py"), checkpoint], cwd=tree, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return worker


def ask(worker: subprocess.Popen, cell: str) -> tuple[float, str]:
    worker.stdin.write(cell + "\n")
    worker.stdin.flush()
    seconds, checksum = worker.stdout.readline().split()
    return float(seconds), checksum


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("after")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.after)
    from bench.hf_generate import OPUS_MT, make_checkpoint

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), OPUS_MT)
        workers = {}
        for tree, path in (("base", args.base), ("after", args.after)):  # compile one at a time
            workers[tree] = start_worker(path, tmp)
            assert workers[tree].stdout.readline().strip() == "ready", tree
        load_timed = os.getloadavg()
        times = {cell: {"base": [], "after": []} for cell in CELLS}
        same = {cell: True for cell in CELLS}
        for pair in range(args.pairs):
            order = ("base", "after") if pair % 2 == 0 else ("after", "base")
            for cell in CELLS:
                sums = {}
                for tree in order:
                    seconds, sums[tree] = ask(workers[tree], cell)
                    times[cell][tree].append(seconds)
                same[cell] &= sums["base"] == sums["after"]
            print(f"pair {pair + 1}/{args.pairs} done, load {os.getloadavg()}", flush=True)
        for worker in workers.values():
            worker.stdin.close()
            worker.wait()
    result = {"pairs": args.pairs, "load_start": load_start, "load_timed_start": load_timed,
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
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    ratio = "after/before, median of pairs (min-max)"
    print(f"| cell | before tok/s | after tok/s | {ratio} | same tokens |")
    print("|---|---:|---:|---:|:---:|")
    for c in result["cells"]:
        print(f"| {c['cell']} | {c['base_tok_s']:.1f} | {c['after_tok_s']:.1f} | "
              f"{c['ratio_median']:.2f}x ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) | "
              f"{'yes' if c['same_tokens'] else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
