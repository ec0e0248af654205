"""The batch-8 beam-4 cell of bench.hf_generate (opus-mt-size random Marian, 32 source tokens,
64 new), float32 and int8, timed in the checkout this runs from: 4 rounds after a warm-up call,
medians in seconds, then the load average. Alternate two checkouts A and B to compare them:

    for i in 1 2 3; do
      (cd A && python PATH/ab_beam_cell.py); (cd B && python PATH/ab_beam_cell.py)
    done

with the project's venv python; the checkpoint is built once into /tmp/ab_beam_cell_ckpt."""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.getcwd())  # the checkout this runs from, not the installed one

from bench.hf_generate import OPUS_MT, make_checkpoint  # noqa: E402
from flax_transformer import hf  # noqa: E402

checkpoint = Path("/tmp/ab_beam_cell_ckpt")
if not (checkpoint / "config.json").exists():
    checkpoint.mkdir(exist_ok=True)
    make_checkpoint(checkpoint, OPUS_MT)
models = {"f32": hf.load(str(checkpoint)), "int8": hf.load(str(checkpoint), quantize="int8")}
sources = np.random.default_rng(0).integers(1, OPUS_MT["vocab_size"] - 1, (8, 32))


def call(model):
    ones = np.ones_like(sources)
    return model.generate(sources, ones, num_beams=4, max_new_tokens=64, min_new_tokens=64)


for model in models.values():  # compile
    call(model)
times = {name: [] for name in models}
for _ in range(4):
    for name, model in models.items():
        start = time.perf_counter()
        call(model)
        times[name].append(time.perf_counter() - start)
medians = {name: round(float(np.median(t)), 3) for name, t in times.items()}
print(os.getcwd(), medians, os.getloadavg()[0], flush=True)
