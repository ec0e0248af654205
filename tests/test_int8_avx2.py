"""kernels.int8_avx2.cc: int8 products with AVX2 on weights packed once (int8_amx.pack's layout),
the int8 kernel of CPUs without AMX. Exact int8 x int8 -> int32 for values in [-127, 127], so
everything it computes is compared for equality with XLA's int8 dot. Skips (with the reason)
where the AVX2 build cannot run."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.kernels import cpu, int8_amx, load

SWITCH = "FLAX_TRANSFORMER_INT8_KERNEL"
WHY_NOT = cpu.platform_problem() or cpu.missing_flags(("avx2",)) or load.load("int8_avx2")[1]
needs_avx2 = pytest.mark.skipif(WHY_NOT is not None, reason=f"AVX2 int8 kernel: {WHY_NOT}")


def _dot(x, w):
    return jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


_product = jax.jit(int8_amx.product, static_argnums=(2, 3))


@needs_avx2
@pytest.mark.parametrize("k", [64, 896])
@pytest.mark.parametrize("n", [32, 100, 1000])
def test_product_is_xla_dot_exactly(k, n):
    rng = np.random.default_rng(k + n)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    packed = jnp.asarray(int8_amx.pack(w))
    for m in (1, 2, 3, 8):  # pairs of rows and the odd one
        x = jnp.asarray(rng.integers(-127, 128, (m, k)), jnp.int8)
        np.testing.assert_array_equal(_product(x, packed, n, "avx2"), _dot(x, jnp.asarray(w)))


@needs_avx2
def test_extreme_values_do_not_saturate():
    """Every product at +-127 * +-127: vpmaddubsw's 16-bit pair sums at their largest."""
    k, n = 128, 64
    w = np.full((k, n), -127, np.int8)
    w[:, ::2] = 127
    x = jnp.asarray(np.stack([np.full(k, 127), np.full(k, -127)]).astype(np.int8))
    got = _product(x, jnp.asarray(int8_amx.pack(w)), n, "avx2")
    np.testing.assert_array_equal(got, _dot(x, jnp.asarray(w)))
    assert int(jnp.abs(got).max()) == k * 127 * 127


@pytest.mark.slow  # ~6 s: a Qwen2 generated twice (the products are checked fast above)
@needs_avx2
def test_int8_qwen2_same_tokens_as_xla_dot(tmp_path, monkeypatch):
    """A small Qwen2 (d 64: every product packed) generates the same int8 tokens on the AVX2
    kernel as on XLA's dot."""
    pytest.importorskip("transformers")
    from bench import llm_generate
    from flax_transformer import hf
    from flax_transformer.nn.int8_products import AmxInt8Matrix

    args = argparse.Namespace(quick=True, layers=None, d_model=64, heads=None, kv_heads=None)
    args.__dict__.update(d_ff=128, vocab=None)
    llm_generate.make_checkpoint(tmp_path, llm_generate.model_sizes(args))
    ids, mask = llm_generate.left_padded(llm_generate.make_prompts(3, 256), pad=0)
    tokens = {}
    for kernel in ("avx2", "xla"):
        monkeypatch.setenv(SWITCH, kernel)
        model = hf.load(tmp_path, quantize="int8")
        leaves = jax.tree.leaves(model.variables, is_leaf=lambda x: hasattr(x, "scale"))
        assert any(isinstance(x, AmxInt8Matrix) for x in leaves) == (kernel == "avx2")
        tokens[kernel] = model.generate(ids, mask, max_new_tokens=10, min_new_tokens=10)
    np.testing.assert_array_equal(tokens["avx2"], tokens["xla"])
