"""One side of the engine before/after: runs in the tree under test (PYTHONPATH=that tree).

    python ab_worker.py CHECKPOINT_DIR

Loads the opus-mt-size Marian checkpoint (written once by ab_pairs.py) and bench.decode's model,
compiles every cell, prints "ready", then for each cell name read on stdin runs that cell once
and prints "seconds checksum" (the checksum of the tokens: both trees must agree).
"""

from __future__ import annotations

import sys
import time
import zlib

import numpy as np


def main(checkpoint: str) -> None:
    import jax

    from flax_transformer import Transformer, hf
    from flax_transformer.decoding import Beam, Greedy, generate
    from flax_transformer.nn.kinds import abstract_variables
    from flax_transformer.spec.presets import preset

    marian = hf.load(checkpoint)
    rng = np.random.default_rng(0)
    sources = rng.integers(1, 58100, (8, 32))

    def hf_cell(batch, beams):
        ids = sources[:batch]
        return lambda: marian.generate(
            ids, np.ones_like(ids), num_beams=beams, max_new_tokens=64, min_new_tokens=64
        )

    config = preset("reference", dropout_rate=0.0, max_len=512)  # bench.decode's model
    model = Transformer(config)
    params = jax.tree.map(
        lambda s: rng.normal(0.0, 0.05, s.shape).astype(s.dtype), abstract_variables(model)
    )
    src = rng.integers(3, config.src_vocab_size, (1, 32)).astype(np.int32)

    def decode_cell(strategy, n_new, use_cache=True):
        def call():
            out = generate(model, params, src, strategy, max_new_tokens=n_new, bos_id=1,
                           eos_id=None, use_cache=use_cache)  # fmt: skip
            return np.asarray(out[0] if isinstance(out, tuple) else out)

        return call

    cells = {
        "hf b1 greedy": hf_cell(1, 1),
        "hf b1 beam4": hf_cell(1, 4),
        "hf b8 greedy": hf_cell(8, 1),
        "hf b8 beam4": hf_cell(8, 4),
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


if __name__ == "__main__":
    main(sys.argv[1])
