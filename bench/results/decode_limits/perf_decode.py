"""The batch-8 beam-4 cell of bench.hf_generate (opus-mt-size random Marian, 32 source tokens,
64 new) in a loop, for `perf record`: CTranslate2 (float32 or int8) or the project (float32 or
int8). Prints each call's seconds once the first (warm-up) call is done.

    python bench/results/decode_limits/perf_decode.py {ct2_int8|ct2_float32|int8|f32} CALLS

The profiles in this folder: CTranslate2 recorded whole (`perf record -g -o ct2.data python
.../perf_decode.py ct2_int8 6`; its start is short), the project attached after its first call
so compilation is left out (`python .../perf_decode.py int8 25 > log &`, then once log has a
line, `perf record -g -p PID -o ours.data -- sleep 12`); `perf report --no-children --sort
dso,symbol -g none` reads them. Run from the repository root with the project's venv python.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.getcwd())

from bench import ct2_peer  # noqa: E402
from bench.hf_generate import OPUS_MT, make_checkpoint  # noqa: E402

CKPT = Path("/tmp/decode_limits_ckpt")


def main() -> None:
    side, calls = sys.argv[1], int(sys.argv[2])
    if not (CKPT / "config.json").exists():
        make_checkpoint(CKPT, OPUS_MT)
    sources = np.random.default_rng(0).integers(1, OPUS_MT["vocab_size"] - 1, (8, 32))
    if side.startswith("ct2_"):
        names = ct2_peer.token_names(
            OPUS_MT["vocab_size"], OPUS_MT["eos_token_id"], OPUS_MT["pad_token_id"]
        )
        converted = CKPT / "ct2"
        if not (converted / "model.bin").exists():
            ct2_peer.convert(CKPT, converted, names)
        peer = ct2_peer.CT2Peer(converted, names, side.removeprefix("ct2_"), os.cpu_count() or 1)

        def call():
            return peer.generate(sources, 4, 64)
    else:
        from flax_transformer import hf

        model = hf.load(CKPT, quantize=None if side == "f32" else side)

        def call():
            return model.generate(
                sources, np.ones_like(sources), num_beams=4, max_new_tokens=64, min_new_tokens=64
            )

    call()
    for _ in range(calls):
        start = time.perf_counter()
        call()
        print(f"{side} {time.perf_counter() - start:.3f} s", flush=True)


if __name__ == "__main__":
    main()
