"""Minor page faults, kernel and user time of single Flax train steps (the benchmark's step,
d_model 512 3+3, 32 x (64 + 64)), four steps after three of warm-up (bench/NOTES.md, "Page
faults"). Run it under the malloc settings to compare, e.g.

    python bench/results/host_memory/page_faults.py
    T=glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295
    GLIBC_TUNABLES=$T python bench/results/host_memory/page_faults.py
    MALLOPT=1 python bench/results/host_memory/page_faults.py   # mallopt at run time instead

with the project's venv python, from the repository root (this script does not re-execute
itself: it measures the environment it is given)."""

import ctypes
import os
import resource
import sys
import time
from pathlib import Path

if os.environ.get("MALLOPT"):  # M_MMAP_MAX = -4, M_TRIM_THRESHOLD = -1 (before JAX starts)
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)
    libc.mallopt(-1, 2**31 - 1)

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import setup  # noqa: E402
from bench.flax_step import build_flax_step, step_loss  # noqa: E402

cfg = setup.bench_config(
    "paper_base",
    src_vocab_size=1000,
    tgt_vocab_size=1000,
    max_len=128,
    num_encoder_layers=3,
    num_decoder_layers=3,
)
state, step, batch = build_flax_step(cfg, setup.make_batch(cfg, 32, 64, 64))
for _ in range(3):
    state, metrics = step(state, batch)
    step_loss(metrics)
for _ in range(4):
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    state, metrics = step(state, batch)
    step_loss(metrics)
    after = resource.getrusage(resource.RUSAGE_SELF)
    kernel_ms = 1e3 * (after.ru_stime - before.ru_stime)
    print(
        f"step {1e3 * (time.perf_counter() - start):.0f} ms, minor faults "
        f"{after.ru_minflt - before.ru_minflt}, kernel {kernel_ms:.0f} ms, "
        f"user {1e3 * (after.ru_utime - before.ru_utime):.0f} ms"
    )
