"""The int8 path's log-softmax over the output logits, alone: why it costs more than its work.

    python bench/results/top_k/int8_log_softmax.py
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=dot,eltwise python bench/results/...

32 rows (batch 8 x beam 4) of opus-mt's 58101 logits as the int8 output product leaves them:
int32 accumulators, a scale per row, a scale per table row, the logits bias. Times (ms,
medians of 30 calls) of: the row maximum with the scaling fused into it, as XLA compiles the
step ("fused max"); the scaling alone, materialised ("logits"); the maximum of materialised
logits ("plain max"); the whole log-softmax ("log_softmax"). On the 2-core Xeon, 2026-11-26
17:20 UTC, three repeats each: fused max 2.18-2.55, logits 0.43-0.49, plain max 0.37-0.46,
log_softmax 3.15-3.54; with YNNPACK's reductions off (the XLA_FLAGS above) fused max 1.60-1.97,
logits 1.04-1.13, plain max 1.66-1.79, log_softmax 4.12-4.68.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

ROWS, VOCAB = 32, 58101
rng = np.random.default_rng(0)
acc = jnp.asarray(rng.integers(-20000, 20000, (ROWS, VOCAB)), jnp.int32)
row_scale = jnp.asarray(rng.random((ROWS, 1)).astype(np.float32) * 1e-3)
table_scale = jnp.asarray(rng.random((VOCAB,)).astype(np.float32) * 1e-2)
bias = jnp.asarray(rng.standard_normal((VOCAB,)).astype(np.float32))
args = (acc, row_scale, table_scale, bias)


def logits(acc, row_scale, table_scale, bias):
    return acc.astype(jnp.float32) * row_scale * table_scale + bias


def median_ms(fn, *fn_args) -> float:
    fn(*fn_args).block_until_ready()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        fn(*fn_args).block_until_ready()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


materialised = jax.jit(logits)(*args)
cases = {
    "fused max": (jax.jit(lambda *a: logits(*a).max(axis=-1)), args),
    "logits": (jax.jit(logits), args),
    "plain max": (jax.jit(lambda x: x.max(axis=-1)), (materialised,)),
    "log_softmax": (jax.jit(lambda *a: jax.nn.log_softmax(logits(*a), axis=-1)), args),
}
for _ in range(3):
    print("  ".join(f"{name} {median_ms(fn, *a):.2f}" for name, (fn, a) in cases.items()))
