"""Minor page faults, kernel and user time of single Flax train steps, in the malloc settings given.

    python -m bench.page_faults
    T=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295
    GLIBC_TUNABLES=$T python -m bench.page_faults
    python -m bench.page_faults --mallopt      # mallopt at run time instead, before JAX starts

What it measures: the benchmark's Flax step (bench.flax_step) at d_model 512, 3+3 layers,
vocab 1000, batch 32 x (64 + 64); `--steps` steps after `--warmup` of warm-up, each with its
wall time, minor page faults, kernel and user time (getrusage). It does not re-execute itself
as the training commands do (training/host_memory.py): it measures the environment it is given,
so that glibc's defaults, the tunables and mallopt can be compared (bench/NOTES.md, "Page
faults": 164,000 faults a step with the defaults, what keeps the block mapped). It was
bench/results/host_memory/page_faults.py until 2026-11-28.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import sys
import time

M_MMAP_MAX, M_TRIM_THRESHOLD = -4, -1  # glibc's mallopt parameters


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.page_faults", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--mallopt", action="store_true", help="no mmap, no trimming (mallopt)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.steps <= 0:
        parser.error("--warmup must be >= 0 and --steps positive")
    if args.mallopt:  # before JAX starts (imported below) and allocates
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)

    from bench import setup
    from bench.flax_step import build_flax_step, step_loss

    cfg = setup.bench_config(
        "paper_base", src_vocab_size=1000, tgt_vocab_size=1000, max_len=128,
        num_encoder_layers=3, num_decoder_layers=3,
    )  # fmt: skip
    state, step, batch = build_flax_step(cfg, setup.make_batch(cfg, 32, 64, 64))
    for _ in range(args.warmup):
        state, metrics = step(state, batch)
        step_loss(metrics)
    for _ in range(args.steps):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        state, metrics = step(state, batch)
        step_loss(metrics)
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"step {1e3 * (time.perf_counter() - start):.0f} ms, minor faults "
            f"{after.ru_minflt - before.ru_minflt}, kernel "
            f"{1e3 * (after.ru_stime - before.ru_stime):.0f} ms, user "
            f"{1e3 * (after.ru_utime - before.ru_utime):.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
