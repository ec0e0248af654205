"""XLA:CPU compiler options for a float32 encoder's forward pass (hf.load(...).forward).

jaxlib 0.10.2's XLA:CPU hands every dot, and some elementwise and reduce ops, to YNNPACK
(`xla_cpu_experimental_ynn_fusion_type`'s default list: individual_dot, eltwise, reduce).
On MiniLM's shape (d 384, 12 heads, d_ff 1536, 6 layers) on the 2-core AMD EPYC (AVX2 + FMA),
loaded, the same program compiled without them (the empty list: XLA's own dot and fusions)
took 0.6-0.9x the time at 1 x 16 and 32 x 128 in every run and no different at 8 x 512 beyond
the noise (docs/benchmarks/encoder.md, "#43, second pass"), float32 outputs within 1e-5 of
torch's either way (1.4e-6 to 2.4e-6). Set per program (jax.jit's compiler_options), not in
XLA_FLAGS: the decoder's generation and training keep XLA's defaults, and nothing has to be
set before JAX starts. A model loaded with quantize="int8" keeps the defaults (measured no
faster without YNNPACK).

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
