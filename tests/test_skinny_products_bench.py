"""bench.skinny_products: it times the products bench.hf_generate's floor counts, and writes
its report."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from bench import hf_generate, skinny_products


def test_the_weights_are_the_floor_s_matmul_weights():
    """The output table and the 48 decoder products: exactly the matrices whose bytes the
    floor of bench.hf_generate counts (its biases and LayerNorms aside)."""
    table, decoder = jax.eval_shape(skinny_products._weights)
    timed = table.size + sum(w.size for w in jax.tree.leaves(decoder))
    assert timed == hf_generate.roofline_weights(hf_generate.OPUS_MT)[1]


@pytest.mark.parametrize("rows", [1, 3])
def test_the_output_step_uses_the_product_generate_runs(rows):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 16)).astype(np.float32)
    x = rng.normal(size=(rows, 16)).astype(np.float32)
    expected = x + (x @ table.T).max(axis=-1, keepdims=True) * 1e-3
    np.testing.assert_allclose(skinny_products.output_step(table, x), expected, rtol=1e-5)


@pytest.mark.slow
def test_run_writes_the_report(tmp_path, capsys):
    out = tmp_path / "skinny.json"
    argv = ["--rows", "1,2", "--steps", "1", "--rounds", "1", "--json", str(out)]
    assert skinny_products.main(argv) == 0
    result = json.loads(out.read_text())
    assert [(c["part"], c["rows"]) for c in result["cells"]] == [
        ("output", 1), ("output", 2), ("decoder", 1), ("decoder", 2),
    ]  # fmt: skip
    assert all(c["ms_per_step"] > 0 and c["gb_s"] > 0 for c in result["cells"])
    assert result["machine"]["matvec_gb_s"] > 0
    assert "| decoder | 2 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--rows", "1,x"], ["--rows", "0"], ["--rounds", "0"]])
def test_bad_arguments_are_argparse_errors(argv):
    with pytest.raises(SystemExit) as error:
        skinny_products.parse_args(["--json", "x", *argv])
    assert error.value.code == 2
