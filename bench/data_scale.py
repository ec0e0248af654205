"""Data at scale: does a corpus 10x larger cost 10x the memory? (It should not: token cache.)

    python -m bench.data_scale [--sizes 300000,3000000] [--steps 20] [--json OUT.json]

For each size, generates a synthetic TSV corpus (random words from a fixed 5,000-word
vocabulary, 2-6 words a side, the target the source reversed and upper-cased; seed 0) in a
temporary directory, runs `train.py --train-tsv` for --steps steps of a tiny model in a
subprocess, and measures:
  corpus_mb       the TSV's size
  prepare_s       from the start of the process until WORKDIR/token_cache/ is installed
                  (imports, the checking scan, tokenizing into the cache)
  peak_rss_mb     the training process's peak resident memory (/proc/PID/status VmHWM,
                  polled every 0.1 s); its pool workers apart (peak_workers_mb: the largest
                  sum of their VmRSS seen)
  step_s          train_time_s / steps from results.json (compile included: the same in all)
  plan_s, data_ms_per_step   measured afterwards in this process on the run's cache: one
                  epoch plan (plan_batches over every example) and the mean time of
                  BatchLoader.__next__ over 200 batches
and prints a table and writes JSON (default bench/results/data_scale.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--d-model", "32", "--num-heads", "2", "--num-layers", "1", "--d-ff", "64",
    "--max-len", "64", "--batch-size", "32", "--log-every", "10", "--eval-every", "1000",
    "--save-every", "1000", "--dropout", "0",
]  # fmt: skip


def write_corpus(path: Path, count: int, seed: int = 0) -> None:
    """`count` lines of random-word pairs, written in blocks (constant memory)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(5000)]
    vocab = np.array(vocab)
    with path.open("w", encoding="utf-8") as handle:
        for start in range(0, count, 100_000):
            n = min(100_000, count - start)
            sizes = rng.integers(2, 7, size=n)
            words = vocab[rng.integers(0, len(vocab), size=int(sizes.sum()))]
            lines, at = [], 0
            for size in sizes:
                chosen = words[at : at + size]
                at += size
                lines.append(" ".join(chosen) + "\t" + " ".join(chosen[::-1]).upper() + "\n")
            handle.write("".join(lines))


def _status(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])  # kB
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def run_one(tmp: Path, count: int, steps: int) -> dict:
    """Generate, train, measure one corpus size."""
    corpus = tmp / f"c{count}.tsv"
    t0 = time.perf_counter()
    write_corpus(corpus, count)
    generate_s = time.perf_counter() - t0
    workdir = tmp / f"run{count}"
    cmd = [sys.executable, str(ROOT / "train.py"), "--train-tsv", str(corpus),
           "--workdir", str(workdir), "--steps", str(steps), *FLAGS]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peak, workers, prepare_s = 0, 0, None
    while proc.poll() is None:
        peak = max(peak, _status(proc.pid, "VmHWM"))
        workers = max(workers, sum(_status(c, "VmRSS") for c in _children(proc.pid)))
        if prepare_s is None and (workdir / "token_cache").is_dir():
            prepare_s = time.perf_counter() - start
        time.sleep(0.1)
    out = proc.stdout.read().decode(errors="replace")
    status = proc.returncode
    if status != 0:
        raise RuntimeError(f"train.py failed ({status}):\n{out[-3000:]}")
    results = json.loads((workdir / "results.json").read_text())
    row = {
        "pairs": count,
        "corpus_mb": corpus.stat().st_size / 2**20,
        "generate_s": generate_s,
        "prepare_s": prepare_s,
        "peak_rss_mb": peak / 1024,
        "peak_workers_mb": workers / 1024,
        "wall_s": time.perf_counter() - start,
        "step_s": results.get("train_time_s", float("nan")) / steps,
        "train_examples": json.loads((workdir / "run.json").read_text())["train_examples"],
    }
    row.update(loader_times(workdir))
    cache = next((workdir / "token_cache").iterdir())
    row["cache_mb"] = sum(p.stat().st_size for p in cache.iterdir()) / 2**20
    return row


def loader_times(workdir: Path) -> dict:
    """One epoch plan and 200 batches of BatchLoader over the run's cache, in this process."""
    from flax_transformer.data.pipeline import BatchLoader, plan_batches
    from flax_transformer.data.token_cache import CachedDataset

    dataset = CachedDataset(next((workdir / "token_cache").iterdir()))
    t0 = time.perf_counter()
    plan_batches(dataset, 32, 64, np.random.default_rng(0))
    plan_s = time.perf_counter() - t0
    loader = BatchLoader(dataset, 32, 64, seed=0)
    next(loader)  # the plan
    t0 = time.perf_counter()
    for _ in range(200):
        next(loader)
    return {"plan_s": plan_s, "data_ms_per_step": (time.perf_counter() - t0) / 200 * 1e3}


def main(argv=None) -> int:
    """Run the benchmark; print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="300000,3000000")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "data_scale.json"))
    p.add_argument("--note", default="", help="what else ran on the machine")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="data_scale-") as tmp:
        for count in (int(s) for s in args.sizes.split(",")):
            rows.append(run_one(Path(tmp), count, args.steps))
            print(json.dumps(rows[-1]), flush=True)
    columns = ["pairs", "corpus_mb", "cache_mb", "prepare_s", "peak_rss_mb", "peak_workers_mb",
               "step_s", "plan_s", "data_ms_per_step"]  # fmt: skip
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c])
                         for c in columns))  # fmt: skip
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        bound = 1.15 * small["peak_rss_mb"] + 100
        print(f"target: peak RSS {large['peak_rss_mb']:.0f} MB <= 1.15 x "
              f"{small['peak_rss_mb']:.0f} + 100 = {bound:.0f} MB and < 2048 MB: "
              f"{'met' if large['peak_rss_mb'] <= min(bound, 2048) else 'NOT met'}")  # fmt: skip
    info = {"rows": rows, "steps": args.steps, "flags": FLAGS, "cpus": os.cpu_count(),
            "load_after": os.getloadavg(), "platform": platform.platform(),
            "note": args.note}  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
