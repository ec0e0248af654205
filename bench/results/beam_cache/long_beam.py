"""Batch 8, beam 4, N new tokens on bench.hf_generate's opus-mt-size Marian: the faster of two
timed calls after one that compiles. Run from a checkout with and one without beam_cache.patch
applied, alternated (bench/NOTES.md, "Tried: beams that never move the cache"):

    PYTHONPATH=. python bench/results/beam_cache/long_beam.py 256 LABEL
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import hf_generate as hg
from flax_transformer import hf


def main(new_tokens: int, label: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hg.make_checkpoint(Path(tmp), hg.OPUS_MT)
        model = hf.load(tmp)
    ids = np.random.default_rng(0).integers(1, hg.OPUS_MT["vocab_size"] - 1, (8, 32))

    def call():
        return np.asarray(model.generate(
            ids, np.ones_like(ids), num_beams=4, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        ))  # fmt: skip

    call()  # compiles
    times = []
    for _ in range(2):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(f"{label} {new_tokens} min {min(times):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
