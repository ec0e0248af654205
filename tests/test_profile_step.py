"""bench.profile_step: thunks attributed to model parts, and a smoke run on the quick config."""

from __future__ import annotations

import pytest

from bench import profile_step as ps
from bench import setup

PREFIX = "jit(train_step)/jvp(Transformer)/Transformer.encode/encoder/layers_0"
BACKWARD = "jit(train_step)/transpose(jvp(Transformer))/Transformer.decode/decoder/layers_2"


@pytest.mark.parametrize(
    ("op_name", "part"),
    [
        (f"{PREFIX}/self_attn/query/dot_general", "fwd:attn_dense"),
        (f"{PREFIX}/self_attn/bqhd,bkhd->bhqk/dot_general", "fwd:attn_core"),
        (f"{BACKWARD}/cross_attn/out/dot_general", "bwd:attn_dense"),
        (f"{BACKWARD}/ffn/linear1/dot_general", "bwd:ffn"),
        (f"{PREFIX}/ffn/Dropout_0/select_n", "fwd:dropout"),
        (f"{PREFIX}/norm2/sub", "fwd:layernorm"),
        (
            "jit(train_step)/transpose(jvp(Transformer))/Transformer.decode/lm_head/dot",
            "bwd:lm_head",
        ),
        ("jit(train_step)/jvp(jit(log_softmax))/exp", "fwd:other"),
        ("", "fwd:other"),  # thunks without metadata
    ],
)
def test_op_names_map_to_model_parts(op_name, part):
    assert ps.model_part(op_name) == part


def test_hlo_op_names_reads_instruction_metadata():
    hlo = (
        '  %ynn_fusion.3 = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="x/y"}\n'
        "  ROOT %copy.1 = f32[8]{0} copy(%c)\n"
    )
    assert ps.hlo_op_names(hlo) == {"ynn_fusion.3": "x/y"}


@pytest.mark.slow  # 13 s: a benchmark smoke run
def test_profile_of_the_quick_config_covers_the_model():
    result = ps.profile(setup.bench_config("tiny"), setup.QUICK_BATCH, steps=1, warmup=1)
    assert result["step_ms"] > 0 and 0 <= result["idle_ms"] <= result["step_ms"]
    for part in ("fwd:ffn", "bwd:ffn", "fwd:attn_core", "fwd:dropout", "fwd:layernorm"):
        assert result["parts"].get(part, 0) > 0, part


@pytest.mark.parametrize(
    ("argv", "max_len", "dims"),
    [
        ([], 128, setup.REFERENCE_BATCH),
        (["--quick"], 16, setup.QUICK_BATCH),
        (
            ["--max-len", "256", "--batch", "8", "--src-len", "256", "--tgt-len", "256"],
            256,
            (8, 256, 256),
        ),
        (["--quick", "--tgt-len", "12"], 16, (2, 8, 12)),
    ],
)
def test_main_passes_the_shape_on(argv, max_len, dims, monkeypatch, capsys):
    """--batch/--src-len/--tgt-len/--max-len reach the profiled config and batch."""
    seen = {}

    def fake_profile(cfg, batch_dims, steps):
        seen.update(max_len=cfg.max_len, dims=tuple(batch_dims))
        return {
            "step_ms": 1.0,
            "idle_ms": 0.0,
            "parts": {"fwd:ffn": 1.0},
            "kinds": {"fwd:ffn": {"dot": 1.0}},
        }

    monkeypatch.setattr(ps, "profile", fake_profile)
    assert ps.main(argv) == 0
    assert seen == {"max_len": max_len, "dims": dims}
    assert "fwd:ffn" in capsys.readouterr().out


def test_main_refuses_a_length_beyond_max_len(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ps.main(["--src-len", "256"])
    assert exit_info.value.code == 2
    assert "raise --max-len" in capsys.readouterr().err
