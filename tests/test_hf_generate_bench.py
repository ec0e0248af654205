"""bench.hf_generate: a --quick run (tiny Marian) writes the report the issue asks for, and
both sides produce the same tokens."""

from __future__ import annotations

import json

import pytest

from bench import ct2_peer, hf_generate


@pytest.mark.slow
def test_quick_run_writes_the_report(tmp_path, capsys):
    out = tmp_path / "hf_generate.json"
    assert hf_generate.main(["--quick", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"cells", "machine"}
    keys = {"batch", "num_beams", "flax_tok_s", "hf_tok_s", "floor_tok_s", "same_tokens"}
    keys |= {"distinct_tokens"}
    if ct2_peer.missing() is None:  # CTranslate2's columns: tok/s and agreement, f32 and int8
        keys |= {f"ct2_{kind}_{what}" for kind in ("float32", "int8")
                 for what in ("tok_s", "agreement")}  # fmt: skip
    assert [(c["batch"], c["num_beams"]) for c in result["cells"]] == [(1, 1), (2, 2)]
    for cell in result["cells"]:
        assert set(cell) == keys
        assert cell["same_tokens"] is True
        assert cell["flax_tok_s"] > 0 and cell["hf_tok_s"] > 0 and cell["floor_tok_s"] > 0
    machine = result["machine"]
    assert machine["matvec_gb_s"] > 0 and machine["gemm_gflops"] > 0
    assert machine["torch_threads"] == machine["cpu_count"]
    assert "| 2 | 2 |" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["t5", "t5-gated"])
def test_quick_t5_run_gives_the_same_tokens(tmp_path, model):
    out = tmp_path / "hf_generate.json"
    argv = ["--quick", "--rounds", "1", "--model", model, "--json", str(out)]
    assert hf_generate.main(argv) == 0
    result = json.loads(out.read_text())
    assert all(cell["same_tokens"] is True for cell in result["cells"])
    assert "T5" in result["machine"]["model"]


def test_t5_small_roofline_weights():
    """t5-small's decoder: 6 x (6 d^2 + 2 d d_ff + 3 d) + 32 x 8 + d + the head 32128 x d."""
    params, matmul = hf_generate.roofline_weights(hf_generate.T5_SMALL, "t5")
    assert matmul == 6 * (6 * 512 * 512 + 2 * 512 * 2048) + 32128 * 512
    assert params == matmul + 6 * 3 * 512 + 32 * 8 + 512
    gated, _ = hf_generate.roofline_weights(hf_generate.T5_SMALL, "t5-gated")
    assert gated - params == 6 * 512 * 2048  # wi_1


def test_roofline_weights_are_the_issue_s_207_mb():
    """Every decoder and output weight of opus-mt size, cross-attention keys/values excluded."""
    params, matmul = hf_generate.roofline_weights(hf_generate.OPUS_MT)
    assert round(params * 4 / 1e6) == 208  # 207.5 MB: the issue's "207 MB in float32"
    assert matmul == 6 * (6 * 512 * 512 + 2 * 512 * 2048) + 58101 * 512


def test_bad_rounds_is_an_argparse_error():
    with pytest.raises(SystemExit) as error:
        hf_generate.parse_args(["--json", "x", "--rounds", "0"])
    assert error.value.code == 2
