"""kernels.int8_amx: int8 products on Intel AMX with weights packed once, and the switch between it
and XLA's int8 dot. The kernel is exact (int8 x int8 -> int32), so everything it computes is
compared for equality with XLA's dot. Tests that run the kernel skip on a CPU without AMX
(the reason is in the skip message); the layout, the switch and the fallbacks run everywhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.kernels import cpu, int8_amx
from flax_transformer.kernels.switches import KERNELS, SwitchError
from flax_transformer.nn.int8 import Int8Matrix
from flax_transformer.nn.int8_products import quantize_for_products

SWITCH = KERNELS.int8.variable
WHY_NOT = KERNELS.int8.reason_unavailable() if KERNELS.int8.value() != "xla" else "switch: xla"
if WHY_NOT is None and KERNELS.int8.choose().build != "amx":
    WHY_NOT = f"the {KERNELS.int8.choose().build} build runs here (tests/test_int8_avx2.py)"
needs_amx = pytest.mark.skipif(WHY_NOT is not None, reason=f"AMX kernel unavailable: {WHY_NOT}")


def _dot(x, w):
    return jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def test_pack_layout_and_padding():
    rng = np.random.default_rng(0)
    values = rng.integers(-127, 128, (128, 70)).astype(np.int8)
    packed = int8_amx.pack(values)
    assert packed.shape == (96 // 16, 128 // 4, 16, 4)  # 70 columns padded to 96
    b, q, j, i = 2, 5, 3, 1
    assert packed[b, q, j, i] == values[4 * q + i, 16 * b + j]
    unpacked = packed.transpose(1, 3, 0, 2).reshape(128, 96)
    np.testing.assert_array_equal(unpacked[:, :70], values)
    assert not unpacked[:, 70:].any()
    with pytest.raises(ValueError, match="K = 96 is not a multiple of 64"):
        int8_amx.pack(np.zeros((96, 32), np.int8))


def test_switch(monkeypatch):
    monkeypatch.setenv(SWITCH, "fast")
    with pytest.raises(SwitchError, match="INT8_KERNEL='fast'.*auto, xla, amx, avx2"):
        KERNELS.int8.value()
    monkeypatch.setenv(SWITCH, "xla")
    assert KERNELS.int8.reason_unavailable() == "FLAX_TRANSFORMER_INT8_KERNEL=xla"
    assert not KERNELS.int8.active()


def test_cpu_without_amx_or_avx2_falls_back_or_says_why(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo=None: {"sse4_2", "fma"})
    monkeypatch.setattr(cpu, "platform_problem", lambda: None)
    monkeypatch.setenv(SWITCH, "auto")
    assert KERNELS.int8.reason_unavailable() == (
        "amx: this CPU lacks amx_int8 and amx_tile; avx2: this CPU lacks avx2"
    )
    assert not KERNELS.int8.active()
    monkeypatch.setenv(SWITCH, "amx")
    with pytest.raises(SwitchError, match="cannot run here: this CPU lacks amx_int8"):
        KERNELS.int8.active()
    monkeypatch.setenv(SWITCH, "auto")
    matrix = quantize_for_products({"params": {"d": {"kernel": np.ones((64, 32), np.float32)}}})
    assert type(matrix["params"]["d"]["kernel"]) is Int8Matrix  # XLA's dot then


def test_cpu_flags_reads_the_first_processor():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_int8\n\nprocessor\t: 1\nflags : x\n"
    assert cpu.cpu_flags(cpuinfo) == {"fpu", "avx2", "amx_tile", "amx_int8"}


@needs_amx
@pytest.mark.parametrize("k", [64, 512])
@pytest.mark.parametrize("n", [32, 100, 1000])
def test_product_is_xla_dot_exactly(k, n):
    rng = np.random.default_rng(k + n)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    packed = jnp.asarray(int8_amx.pack(w))
    product = jax.jit(int8_amx.product, static_argnums=2)
    for m in (1, 5, 16, 17, 32, 40):
        x = jnp.asarray(rng.integers(-127, 128, (m, k)), jnp.int8)
        np.testing.assert_array_equal(product(x, packed, n), _dot(x, jnp.asarray(w)))


@needs_amx
def test_concurrent_products_in_a_loop():
    """Independent products in one program (XLA may run them at once on its pool, every pool
    thread busy), inside a while loop: the same as XLA's dot, and no deadlock."""
    rng = np.random.default_rng(1)
    ws = [rng.integers(-127, 128, (512, 2048)).astype(np.int8) for _ in range(4)]
    packed = [jnp.asarray(int8_amx.pack(w)) for w in ws]
    x0 = jnp.asarray(rng.integers(-127, 128, (8, 512)), jnp.int8)

    def run(x, weights, amx):
        def body(_, x):
            outs = [int8_amx.product(x, p, 2048) if amx else _dot(x, p) for p in weights]
            total = sum(o[:, :512] for o in outs)
            return (total % 255 - 127).astype(jnp.int8)

        return jax.lax.fori_loop(0, 5, body, x)

    got = jax.jit(lambda x, ws: run(x, ws, True))(x0, packed)
    want = jax.jit(lambda x, ws: run(x, ws, False))(x0, [jnp.asarray(w) for w in ws])
    np.testing.assert_array_equal(got, want)


@needs_amx
def test_int8_marian_same_logits_and_tokens_as_xla_dot(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from flax_transformer import hf
    from tests import hf_models

    sizes = dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128)
    path = hf_models.save(hf_models.build("marian", **sizes), tmp_path / "marian")
    rng = np.random.default_rng(0)
    ids, mask = hf_models.ragged_batch(
        rng, hf_models.VOCAB - 1, [7, 4, 9], low=2, pad=hf_models.MARIAN_PAD
    )
    results = {}
    for kernel in ("amx", "xla"):
        monkeypatch.setenv(SWITCH, kernel)
        model = hf.load(path, quantize="int8")
        matrices = [
            x
            for x in jax.tree.leaves(model.variables, is_leaf=_is_int8)
            if isinstance(x, Int8Matrix)
        ]
        kinds = {type(x).__name__ for x in matrices}
        assert kinds == ({"AmxInt8Matrix"} if kernel == "amx" else {"Int8Matrix"})
        tokens = model.generate(ids, mask, num_beams=3, max_new_tokens=12)
        results[kernel] = np.asarray(tokens)
    np.testing.assert_array_equal(results["amx"], results["xla"])


def _is_int8(x) -> bool:
    return isinstance(x, Int8Matrix)


def test_relative_position_bias_stays_float():
    """T5's relative position bias is an `embedding` param read by jnp.take in its own module,
    not an nn.Embed the int8 interceptor serves: quantised, jnp.take would get an Int8Matrix."""
    table = np.ones((32, 4), np.float32)
    variables = {"params": {"encoder": {"relative_bias": {"embedding": table}}}}
    quantized = quantize_for_products(variables)["params"]
    assert quantized["encoder"]["relative_bias"]["embedding"] is table
