"""bench.profile_vs_torch's categories (XLA thunks and torch ops sorted alike) and
bench.step_gemms's count of a step's products."""

from __future__ import annotations

import argparse

import pytest

from bench import profile_vs_torch as pvt
from bench import setup, step_gemms

FWD = "jit(train_step)/jvp(Transformer)/Transformer.encode/encoder/layers_0"
BWD = "jit(train_step)/transpose(jvp(Transformer))/Transformer.decode/decoder/layers_2"


@pytest.mark.parametrize(
    ("op_name", "thunk", "is_product", "category"),
    [
        (f"{FWD}/self_attn/query/dot_general", "ynn_fusion.1", True, "dense GEMMs fwd"),
        (f"{BWD}/ffn/linear1/dot_general", "ynn_fusion.2", True, "dense GEMMs bwd"),
        (f"{FWD}/self_attn/bqhd,bkhd->bhqk/dot_general", "dot.3", True, "attention products"),
        (f"{BWD}/cross_attn/exp", "multiply_select_fusion", False, "attention softmax+mask"),
        (f"{FWD}/ffn/Dropout_0/select_n", "select_fusion", False, "dropout"),
        (f"{FWD}/norm2/sub", "subtract_fusion", False, "LayerNorm"),
        ("jit(train_step)/jvp(jit(log_softmax))/exp", "exp_fusion", False, "loss"),
        ("jit(train_step)/transpose(jvp(jit(log_softmax)))/mul", "fusion", False, "loss"),
        ("jit(train_step)/mul", "multiply_add_fusion", False, "optimizer"),
        (f"{FWD}/add", "copy_bitcast_fusion", False, "copies/transposes"),
        (f"{FWD}/self_attn/transpose", "transpose_copy_fusion", False, "copies/transposes"),
        (f"{FWD}/ffn/relu", "max_fusion", False, "other"),
    ],
)
def test_xla_thunks_fall_into_categories(op_name, thunk, is_product, category):
    assert pvt.xla_category(op_name, thunk, is_product) == category


@pytest.mark.parametrize(
    ("name", "phase", "category"),
    [
        ("aten::addmm", "forward", "dense GEMMs fwd"),
        ("aten::mm", "backward", "dense GEMMs bwd"),
        ("aten::bmm", "backward", "attention products"),
        ("aten::_log_softmax", "loss", "loss"),  # not the attention's "_softmax"
        ("aten::_log_softmax_backward_data", "backward", "loss"),
        ("aten::_softmax_backward_data", "backward", "attention softmax+mask"),
        ("aten::native_layer_norm_backward", "backward", "LayerNorm"),
        ("aten::bernoulli_", "forward", "dropout"),
        ("aten::mul_", "optimizer", "optimizer"),
        ("aten::linalg_vector_norm", "clip", "optimizer"),
        ("aten::copy_", "forward", "copies/transposes"),
        ("aten::add", "forward", "other"),
    ],
)
def test_torch_ops_fall_into_the_same_categories(name, phase, category):
    assert pvt.torch_category(name, phase) == category


def test_product_instructions_include_fusions_that_hold_a_dot():
    hlo = """
%fused_dot (p0: f32[8,4], p1: f32[4,2]) -> f32[8,2] {
  ROOT %d = f32[8,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%fused_add (p0: f32[8]) -> f32[8] {
  ROOT %a = f32[8]{0} add(%p0, %p0)
}
ENTRY %main {
  %ynn_fusion.1 = f32[8,2]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot
  %add_fusion = f32[8]{0} fusion(%y), kind=kLoop, calls=%fused_add
  ROOT %dot.2 = f32[2,2]{1,0} dot(%u, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    assert pvt.product_instructions(hlo) == {"ynn_fusion.1", "dot.2", "d"}


@pytest.mark.parametrize(
    ("preset", "overrides", "dims"),
    [
        ("tiny", {}, (2, 8, 8)),
        ("reference", {}, (32, 64, 64)),
        ("reference", {"max_len": 256}, (8, 256, 256)),
        ("paper_base", {"src_vocab_size": 1000, "tgt_vocab_size": 1000}, (4, 16, 16)),
    ],
)
def test_step_gemms_counts_every_product_of_the_step(preset, overrides, dims):
    """The products step_gemms times, with their counts, add up to the step's model FLOPs."""
    cfg = setup.bench_config(preset, **overrides)
    batch, length, _ = dims
    args = argparse.Namespace(
        d_model=cfg.d_model,
        d_ff=cfg.d_ff,
        heads=cfg.num_heads,
        layers=cfg.num_encoder_layers,
        vocab=cfg.tgt_vocab_size,
        batch=batch,
        len=length,
    )
    flops = sum(p["count"] * p["flops"] for p in step_gemms.products(args))
    assert flops == setup.model_flops_per_step(cfg, *dims)


def test_step_gemms_adds_each_product_times_its_count():
    rows = [
        {"count": 2, "jax_ms": 1.5, "torch_ms": 1.0, "jax_best_ms": 1.0, "torch_best_ms": 0.5},
        {"count": 3, "jax_ms": 2.0, "torch_ms": 4.0, "jax_best_ms": 1.5, "torch_best_ms": 3.0},
    ]
    for row in rows:
        row["gflop"] = 0.5
    assert step_gemms.step_floor(rows) == {"jax": 9.0, "torch": 14.0, "gflop": 2.5}
    assert step_gemms.step_floor(rows, "_best") == {"jax": 6.5, "torch": 10.0, "gflop": 2.5}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--d-model", "10", "--heads", "4"], "not divisible by --heads 4"),
        (["--len", "0"], "--len"),
    ],
)
def test_step_gemms_refuses_bad_sizes(argv, message, capsys):
    with pytest.raises(SystemExit):
        step_gemms.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_torch_profile_names_the_phases_of_the_shared_step():
    """profile_torch times bench.train_throughput's torch step with each phase a profiler
    range: the optimizer's and the backward's ops land in their categories (they come from
    the phases; without the ranges both would be empty)."""
    cfg = setup.bench_config("small", src_vocab_size=64, tgt_vocab_size=64)
    batch = setup.make_batch(cfg, *setup.QUICK_BATCH)
    result = pvt.profile_torch(cfg, batch, steps=1, warmup=1)
    assert result["ms"]["optimizer"] > 0
    assert result["ms"]["dense GEMMs bwd"] > 0
