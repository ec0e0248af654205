"""One batch-8 beam-4 (or other) cell of bench.hf_generate in the checkout this runs from: the
first call (compilation included) and the median of 4 timed calls, in seconds; the tokens are
saved to OUT.npy for comparing two checkouts.

    python bench/results/decode_limits/beam_cell.py {f32|int8} BATCH BEAMS OUT.npy

Alternate it between a checkout with and without a patch (bench/results/decode_limits/*.patch)
with the project's venv python; the opus-mt-size random Marian is built once into
/tmp/decode_limits_ckpt."""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.getcwd())  # the checkout this runs from, not the installed one

from bench.hf_generate import OPUS_MT, make_checkpoint  # noqa: E402
from flax_transformer import hf  # noqa: E402

CKPT = Path("/tmp/decode_limits_ckpt")


def main() -> None:
    kind, batch, beams, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if not (CKPT / "config.json").exists():
        make_checkpoint(CKPT, OPUS_MT)
    model = hf.load(CKPT, quantize=None if kind == "f32" else kind)
    rng = np.random.default_rng(0)
    src = rng.integers(1, OPUS_MT["vocab_size"] - 1, (8, 32))[:batch]

    def call():
        return model.generate(
            src, np.ones_like(src), num_beams=beams, max_new_tokens=64, min_new_tokens=64
        )

    start = time.perf_counter()
    tokens = np.asarray(call())
    first = time.perf_counter() - start
    times = []
    for _ in range(4):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    np.save(out, tokens)
    print(
        f"{os.getcwd()} {kind} batch {batch} beams {beams}: first call {first:.1f} s, "
        f"median {np.median(times):.3f} s, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
