"""kernels.f32_packed / nn.f32_products: float32 products of a few rows on weights packed once, the
switch between them and XLA's dot, and hf.generate on them. The kernel sums in another order
than XLA's dot, so products are compared at float32's tolerance (DESIGN: ~1e-5) and
generation for identical tokens (with transformers, and with XLA's products). Tests that run
the kernel skip on a CPU without AVX-512 (the reason is in the skip message); the layout, the
switch and the fallbacks run everywhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.kernels import cpu, f32_packed, load
from flax_transformer.kernels.switches import KERNELS, SwitchError
from flax_transformer.nn.f32_products import PackedF32Matrix, pack_for_products

SWITCH = KERNELS.f32.variable
CHOICE = KERNELS.f32.choose() if KERNELS.f32.value() != "xla" else None
BUILD, WHY_NOT = (CHOICE.build, CHOICE.why) if CHOICE else (None, "switch: xla")
needs_kernel = pytest.mark.skipif(BUILD is None, reason=f"kernel unavailable: {WHY_NOT}")
BOTH = all(
    cpu.missing_flags(("avx512f", "avx2", "fma")) is None and load.load(lib)[1] is None
    for lib in ("f32_packed_avx512", "f32_packed_avx2")
)
needs_both = pytest.mark.skipif(not BOTH, reason="the AVX-512 and AVX2 builds do not both run")


def _relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_pack_layout_and_padding():
    values = np.arange(5 * 40, dtype=np.float32).reshape(5, 40)
    packed = f32_packed.pack(values)
    assert packed.shape == (64 // 16, 5, 16) and packed.dtype == np.float32  # 40 -> 64 columns
    p, k, j = 1, 3, 7
    assert packed[p, k, j] == values[k, 16 * p + j]
    unpacked = packed.transpose(1, 0, 2).reshape(5, 64)
    np.testing.assert_array_equal(unpacked[:, :40], values)
    assert not unpacked[:, 40:].any()


def test_switch_values(monkeypatch):
    monkeypatch.setenv(SWITCH, "fast")
    with pytest.raises(SwitchError, match="FLAX_TRANSFORMER_F32_KERNEL='fast'"):
        KERNELS.f32.value()
    monkeypatch.setenv(SWITCH, "xla")
    assert KERNELS.f32.reason_unavailable() == "FLAX_TRANSFORMER_F32_KERNEL=xla"
    assert not KERNELS.f32.active()


def test_cpu_without_avx512_or_avx2_falls_back_or_says_why(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo=None: {"sse4_2"})
    monkeypatch.setattr(cpu, "platform_problem", lambda: None)
    monkeypatch.setenv(SWITCH, "auto")
    why = "avx512: this CPU lacks avx512f; avx2: this CPU lacks avx2 and fma"
    assert KERNELS.f32.reason_unavailable() == why
    assert not KERNELS.f32.active()
    monkeypatch.setenv(SWITCH, "avx512")
    with pytest.raises(SwitchError, match="cannot run here: this CPU lacks avx512f"):
        KERNELS.f32.active()


@pytest.mark.skipif(
    bool(cpu.missing_flags(("avx2", "fma")) or load.load("f32_packed_avx2")[1]),
    reason="the AVX2 build does not run",
)
def test_auto_takes_avx2_without_avx512(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo=None: {"avx2", "fma"})
    monkeypatch.setenv(SWITCH, "auto")
    choice = KERNELS.f32.choose()
    assert (choice.build, choice.library, choice.why) == ("avx2", "f32_packed_avx2", None)


def test_other_platforms_say_why(monkeypatch):
    monkeypatch.setattr(cpu.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cpu.platform, "machine", lambda: "arm64")
    monkeypatch.setenv(SWITCH, "auto")
    why = "the kernels need Linux on x86-64, this is Darwin arm64"
    assert KERNELS.f32.reason_unavailable() == f"avx512: {why}; avx2: {why}"


def test_kernels_step_aside_when_jax_computes_on_a_gpu(monkeypatch):
    # A jitted program on a GPU cannot call these CPU kernels: a float32 or int8 model on a
    # GPU must keep XLA's products there, whatever the host CPU has.
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(cpu, "platform_problem", lambda: None)
    monkeypatch.setenv(SWITCH, "auto")
    monkeypatch.setenv(KERNELS.int8.variable, "auto")
    why = "the kernels run on the CPU, JAX computes on gpu here"
    assert KERNELS.f32.reason_unavailable() == f"avx512: {why}; avx2: {why}"
    assert not KERNELS.f32.active()
    assert KERNELS.int8.reason_unavailable() == f"amx: {why}; avx2: {why}"


def test_pack_for_products_packs_float32_matrices_only():
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((8, 6), dtype=np.float32)
    table = rng.standard_normal((10, 8), dtype=np.float32)
    variables = {
        "params": {
            "dense": {"kernel": kernel, "bias": np.zeros(6, np.float32)},
            "embed": {"embedding": table},
            "wide": {"kernel": np.zeros((8, 6), np.float64)},  # not float32: as it is
            # T5's relative position bias: an `embedding` param, but no nn.Embed's
            "encoder": {"relative_bias": {"embedding": np.ones((32, 4), np.float32)}},
        },
        "other": {"kernel": kernel},  # other collections: as they are
    }
    packed = pack_for_products(variables)
    dense, embed = packed["params"]["dense"]["kernel"], packed["params"]["embed"]["embedding"]
    assert isinstance(dense, PackedF32Matrix) and dense.values is None  # a kernel: packed only
    np.testing.assert_array_equal(dense.packed, f32_packed.pack(kernel))
    assert isinstance(embed, PackedF32Matrix) and embed.values is table  # kept for lookups
    np.testing.assert_array_equal(embed.packed, f32_packed.pack(table.T))
    assert packed["params"]["dense"]["bias"] is variables["params"]["dense"]["bias"]
    assert packed["params"]["wide"]["kernel"].dtype == np.float64
    bias = packed["params"]["encoder"]["relative_bias"]["embedding"]
    assert bias is variables["params"]["encoder"]["relative_bias"]["embedding"]
    assert packed["other"] is variables["other"]


@needs_kernel
@pytest.mark.parametrize("k", [8, 64, 512, 2048])
@pytest.mark.parametrize("n", [32, 100, 1000])
def test_product_matches_xla_dot_at_float32_precision(k, n):
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n), dtype=np.float32)
    packed = jnp.asarray(f32_packed.pack(w))
    product = jax.jit(f32_packed.product, static_argnums=2)
    for m in (1, 2, 3, 4, 5, 6, 7, 13, 32, 513):  # 513 x 2048: XLA on the packed layout
        x = rng.standard_normal((m, k), dtype=np.float32)
        got = product(jnp.asarray(x), packed, n)
        assert got.shape == (m, n)
        exact = x.astype(np.float64) @ w.astype(np.float64)
        assert _relative_error(got, exact) < 1e-5, (m, k, n)
        xla = jnp.asarray(x) @ jnp.asarray(w)
        assert _relative_error(got, xla) < 1e-5, (m, k, n)


@needs_kernel
def test_product_rejects_a_mismatched_input():
    packed = jnp.asarray(f32_packed.pack(np.zeros((64, 32), np.float32)))
    with pytest.raises(ValueError, match="x has 32 features, the weights 64"):
        f32_packed.product(jnp.zeros((2, 32)), packed, 32)


@needs_kernel
def test_concurrent_products_same_as_alone_and_in_a_loop():
    """Independent products in one program (XLA may run them at once on its pool, every pool
    thread busy): the same numbers as each product alone (each output is one fixed chain of
    multiply-adds, whatever the threads); and in a while loop, no deadlock."""
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((512, 2048), dtype=np.float32) / 20 for _ in range(4)]
    packed = [jnp.asarray(f32_packed.pack(w)) for w in ws]
    x0 = jnp.asarray(rng.standard_normal((8, 512), dtype=np.float32))
    together = jax.jit(lambda x: [f32_packed.product(x, p, 2048) for p in packed])(x0)
    alone = jax.jit(f32_packed.product, static_argnums=2)
    for out, p in zip(together, packed, strict=True):
        np.testing.assert_array_equal(out, alone(x0, p, 2048))

    def body(_, x):
        return jnp.tanh(sum(f32_packed.product(x, p, 2048)[:, :512] for p in packed))

    looped = jax.jit(lambda x: jax.lax.fori_loop(0, 5, body, x))(x0)
    x = np.asarray(x0, np.float64)
    for _ in range(5):
        x = np.tanh(sum(x @ w.astype(np.float64)[:, :512] for w in ws)[:, :512])
    assert _relative_error(looped, x) < 1e-4  # five float32 layers deep


@needs_both
def test_both_builds_give_the_same_bits():
    rng = np.random.default_rng(2)
    for m, k, n in [(1, 512, 1000), (7, 64, 96), (32, 2048, 512)]:
        x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        packed = jnp.asarray(f32_packed.pack(rng.standard_normal((k, n), dtype=np.float32)))
        wide, narrow = (
            jax.jit(f32_packed.product, static_argnums=(2, 3))(x, packed, n, build)
            for build in ("avx512", "avx2")
        )
        np.testing.assert_array_equal(wide, narrow)


def _generate_both_ways(monkeypatch, path, ids, mask, **options):
    """{kernel: tokens} of hf.load(path).generate(...) under each switch value, and the model
    each generation ran (hf.generation caches the packed weights per HFModel)."""
    from flax_transformer import hf
    from flax_transformer.hf import generation

    tokens, models = {}, {}
    for kernel in (BUILD, "xla"):
        monkeypatch.setenv(SWITCH, kernel)
        model = hf.load(path)
        tokens[kernel] = np.asarray(model.generate(ids, mask, **options))
        models[kernel] = generation._for_generation(model)
    return tokens, models


@needs_kernel
# Both in the slow pass (the fast suite is at its 8-minute budget; ~30 s each on 2 cores);
# the fast suite keeps the kernel's products against XLA's dot.
@pytest.mark.slow
@pytest.mark.parametrize("family", ["marian", "gpt2"])
def test_generation_on_packed_weights_is_token_identical(tmp_path, monkeypatch, family):
    """Beam search in float32 on the packed products gives transformers' tokens, and those of
    XLA's products: a Marian (tied output table, its one-row path at batch 1) on a
    right-padded batch, a GPT-2 (untied head) on left-padded prompts."""
    pytest.importorskip("transformers")
    import torch

    from tests import hf_models

    # Weights larger than transformers' init: the outputs depend on the input.
    init = {"initializer_range" if family == "gpt2" else "init_std": 0.5}
    torch_model = hf_models.build(family, seed=1, **init)
    path = hf_models.save(torch_model, tmp_path / family)
    rng = np.random.default_rng(0)
    if family == "gpt2":
        ids, mask = hf_models.ragged_batch(rng, hf_models.VOCAB, (6, 3, 5), pad=0)
        ids, mask = ids[:, ::-1].copy(), mask[:, ::-1].copy()
    else:
        ids, mask = hf_models.ragged_batch(
            rng, hf_models.VOCAB - 1, (9, 4, 7), pad=hf_models.MARIAN_PAD
        )
    for rows in (slice(0, 1), slice(None)):  # batch 1 (the one-row table product), batch 3
        options = dict(num_beams=3, max_new_tokens=10)
        tokens, models = _generate_both_ways(monkeypatch, path, ids[rows], mask[rows], **options)
        np.testing.assert_array_equal(tokens[BUILD], tokens["xla"])
        with torch.no_grad():
            want = torch_model.generate(
                torch.from_numpy(ids[rows]), attention_mask=torch.from_numpy(mask[rows]), **options
            ).numpy()
        np.testing.assert_array_equal(tokens[BUILD], want)
    (module, variables), (plain, _) = models[BUILD], models["xla"]
    assert type(module).__name__.startswith("PackedProducts")
    assert not type(plain).__name__.startswith("PackedProducts")
    leaves = jax.tree.leaves(variables, is_leaf=_packed)
    assert sum(isinstance(x, PackedF32Matrix) for x in leaves) >= 8


def _packed(x) -> bool:
    return isinstance(x, PackedF32Matrix)
