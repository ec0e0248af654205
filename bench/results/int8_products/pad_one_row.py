"""One row padded with zero rows before the dynamic int8 product (int8_products.py forms),
against float32 and the unpadded int8 product: the output table and the decoder products,
16-step jitted loop, best of 5 interleaved rounds, ms per step.

    python bench/results/int8_products/pad_one_row.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import int8_products as ip
import jax.numpy as jnp

from bench.skinny_products import D_MODEL, _loop, _weights

table, dec = _weights()
st = {f: ip.prepare(f, table, dec) for f in ("f32", "w8a8")}


def padded(step, pad):
    def s(w, x):
        xp = jnp.concatenate([x, jnp.zeros((pad - 1, x.shape[1]), x.dtype)])
        return step(w, xp)[:1]

    return s


loops = {}
for part, mk, i in (("output", ip.output_step, 0), ("decoder", ip.decoder_step, 1)):
    loops[(part, "f32 1 row")] = (_loop(mk("f32"), 16), st["f32"][i])
    loops[(part, "w8a8 1 row")] = (_loop(mk("w8a8"), 16), st["w8a8"][i])
    for pad in (2, 4, 8):
        loops[(part, f"w8a8 padded to {pad}")] = (_loop(padded(mk("w8a8"), pad), 16), st["w8a8"][i])
x = jnp.full((1, D_MODEL), 0.1)
for loop, w in loops.values():
    loop(w, x).block_until_ready()
best = {k: 1e9 for k in loops}
for _ in range(5):
    for k, (loop, w) in loops.items():
        t = time.perf_counter()
        loop(w, x).block_until_ready()
        best[k] = min(best[k], (time.perf_counter() - t) / 16)
for k, v in best.items():
    print(k, f"{v * 1e3:.2f} ms")
