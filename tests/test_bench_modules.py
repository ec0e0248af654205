"""Every bench module imports, and every runnable one (`python -m bench.NAME`) shows its --help;
the modules that came out of bench/results/ keep their one piece of logic and their refusals."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import bench

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__))
RUNNABLE = [
    name
    for name in MODULES
    if 'if __name__ == "__main__":' in (Path(bench.__path__[0]) / f"{name}.py").read_text()
]


def test_the_modules_are_found():
    assert {"ab_decode", "hlo_ops", "f32_rows", "page_faults", "hf_generate"} <= set(RUNNABLE)
    assert "llm_generate" in RUNNABLE
    assert {"setup", "flax_step"} <= set(MODULES) - set(RUNNABLE)  # libraries of the others


@pytest.mark.parametrize("name", MODULES)
def test_imports(name):
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench.{name}: no docstring saying what it measures"


@pytest.mark.parametrize("name", RUNNABLE)
def test_help(name, capsys):
    module = importlib.import_module(f"bench.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_hlo_ops_reads_opcodes_shapes_and_fusion_kinds():
    from bench.hlo_ops import instructions, loop_body

    hlo = """\
%body.1 (p: (s32[])) -> (s32[]) {
  %p = (s32[]) parameter(0)
  ROOT %add.3 = s32[] add(s32[] %x, s32[] %y)
}

ENTRY %main (a: f32[2,3]) -> f32[2,3] {
  %fusion.7 = f32[2,3]{1,0} fusion(f32[2,3]{1,0} %a), kind=kLoop, calls=%fused
  %while.2 = (s32[]) while((s32[]) %t), condition=%cond.1, body=%body.1
  ROOT %negate.1 = f32[2,3]{1,0} negate(f32[2,3]{1,0} %fusion.7)
}
"""
    assert instructions(hlo) == [
        "add s32[] ",
        "fusion f32[2,3]{1,0} kLoop",
        "negate f32[2,3]{1,0} ",
        "parameter (s32[]) ",
        "while (s32[]) ",
    ]
    assert instructions(loop_body(hlo)) == ["add s32[] ", "parameter (s32[]) "]


def test_ab_decode_refuses_a_tree_without_the_package(tmp_path, capsys):
    from bench import ab_decode

    root = Path(bench.__path__[0]).parent
    with pytest.raises(SystemExit) as exit_:
        ab_decode.main([str(tmp_path), str(root), "--json", str(tmp_path / "out.json")])
    assert exit_.value.code == 2
    assert f"base {tmp_path}: no flax_transformer/ there" in capsys.readouterr().err


def test_f32_rows_says_why_when_the_kernel_is_off(monkeypatch, capsys):
    from bench import f32_rows
    from flax_transformer.kernels.switches import KERNELS

    monkeypatch.setenv(KERNELS.f32.variable, "xla")
    assert f32_rows.main(["--rows", "16"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("bench.f32_rows: the float32 kernel does not run here")
        and err.count("\n") == 1
    )


def test_encoder_compares_float32_by_tolerance_and_int8_by_cosine():
    from bench import encoder

    reference = np.array([[[1.0, 0.0], [0.0, 2.0]]], np.float32)
    close = encoder.compare("project", reference + 5e-6, reference)
    assert close["within_tolerance"] and close["max_abs_diff"] == pytest.approx(5e-6, rel=1e-2)
    assert not encoder.compare("ort", reference + 2e-5, reference)["within_tolerance"]
    turned = np.array([[[1.0, 1.0], [0.0, 2.0]]], np.float32)  # the first token 45 degrees off
    int8 = encoder.compare("ct2_int8", turned, reference)
    assert int8["cosine_min"] == pytest.approx(np.sqrt(0.5)) and "within_tolerance" not in int8
    assert int8["cosine_mean"] == pytest.approx((np.sqrt(0.5) + 1) / 2)


@pytest.mark.slow
def test_encoder_smoke_runs_the_tiny_model_against_torch(tmp_path, capsys):
    """bench.encoder --tiny: every project side and torch time every cell, the float32 outputs
    within 1e-5 of torch's (ONNX Runtime's export and CTranslate2 cost a minute: left out).
    About 10 s on the idle 2-core machine: slow."""
    from bench import encoder

    out = tmp_path / "encoder.json"
    argv = ["--json", str(out), "--tiny", "--rounds", "1", "--no-ort", "--no-ct2"]
    assert encoder.main(argv) == 0
    result = json.loads(out.read_text())
    assert [(c["batch"], c["tokens"]) for c in result["cells"]] == list(encoder.TINY_CELLS)
    for cell in result["cells"]:
        assert cell["project"]["within_tolerance"] and cell["project_jit"]["within_tolerance"]
        assert cell["torch"]["seq_s"] > 0 and "ort" not in cell
    table = capsys.readouterr().out
    assert table.startswith("CPU: ") and "| 1 x 8 |" in table
    assert "ONNX Runtime left out (--no-ort)" in table


@pytest.mark.slow
def test_encoder_variants_time_every_variant_and_compare_it_with_forwards_program(tmp_path):
    """bench.encoder_variants --tiny: every variant timed on every cell, each within float32
    rounding of the parameters-as-arguments program (`forward`'s); the einsum attention is a
    different program from the heads-first one (its outputs are not bit for bit the same)."""
    from bench import encoder_variants

    out = tmp_path / "variants.json"
    argv = ["--tiny", "--rounds", "1", "--cell", "2x16", "--json", str(out)]
    assert encoder_variants.main(argv) == 0
    cell = json.loads(out.read_text())["cells"]["2x16"]
    assert {"arguments", "constants", "einsum_attention", "eigen_one_thread"} <= set(cell)
    for found in cell.values():
        assert found["median_ms"] > 0 and found["max_abs_diff"] < 1e-5
    assert cell["arguments"]["max_abs_diff"] == 0 and cell["einsum_attention"]["max_abs_diff"] > 0


def test_encoder_variants_refuse_a_bad_cell(capsys):
    from bench import encoder_variants

    with pytest.raises(SystemExit):
        encoder_variants.parse_args(["--cell", "16"])
    assert "--cell takes BATCHxTOKENS" in capsys.readouterr().err


def test_encoder_peers_say_which_package_is_missing():
    from bench import encoder_peers

    assert encoder_peers.missing(("json",), "JSON") is None
    line = encoder_peers.missing(("json", "no_such_module_here"), "ONNX Runtime")
    assert line.startswith("no_such_module_here is not installed (")
    assert "the ONNX Runtime columns are skipped" in line and "[bench]" in line
