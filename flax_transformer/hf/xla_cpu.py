"""XLA:CPU compiler options for a float32 encoder's forward pass (hf.load(...).forward).

jaxlib 0.10.2's XLA:CPU hands every dot, and some elementwise and reduce ops, to YNNPACK
(`xla_cpu_experimental_ynn_fusion_type`'s default list: individual_dot, eltwise, reduce).
On MiniLM's shape (d 384, 12 heads, d_ff 1536, 6 layers) on the 2-core AMD EPYC (AVX2 + FMA)
the same program compiled without them (the empty list: XLA's own dot and fusions) took
0.83-0.87x the time at 1 x 16 and 0.64-0.79x at 32 x 128, 0.9-1.0x at 8 x 512, interleaved in
one process (docs/benchmarks/encoder.md, "XLA:CPU options"), float32 outputs within 1e-5 of
torch's either way. Set per program (jax.jit's compiler_options), not in XLA_FLAGS: the
decoder's generation and training keep XLA's defaults, and nothing has to be set before JAX
starts. A model loaded with quantize="int8" keeps the defaults (not measured to help).

`encode = jax.jit(model.encoder_fn(), compiler_options=ENCODER_COMPILER_OPTIONS)` gives a
user's own jit the same.
"""

from __future__ import annotations

import jax

ENCODER_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}  # YNNPACK off


def encoder_compiler_options(float32: bool) -> dict[str, str] | None:
    """The compiler options for an encoder's forward: ENCODER_COMPILER_OPTIONS for a float32
    model on the CPU, else None (XLA's defaults)."""
    if not float32 or jax.default_backend() != "cpu":
        return None
    return dict(ENCODER_COMPILER_OPTIONS)
