"""Weight-only int8: per-output-channel symmetric scales for every matrix, the int8 models that
dequantise inside jit, and `generate --int8`."""

from __future__ import annotations

import io

import jax
import numpy as np
import pytest

from flax_transformer.cli.generate import main as generate_main
from flax_transformer.decoding import Greedy, generate
from flax_transformer.export.int8 import (
    Int8Matrix,
    int8_model,
    quantize_matrix,
    quantize_params,
    quantize_variables,
    tree_nbytes,
)
from flax_transformer.nn.kinds import model_for
from flax_transformer.runs.load import load_run
from tests.export_runs import CONFIG, fabricate_run, random_params


def test_quantize_matrix_per_output_channel():
    w = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    w[:, 3] *= 100.0  # one loud column must not cost the others their precision
    w[:, 4] = 0.0
    q = quantize_matrix(w, reduce_axis=0)  # a Dense kernel (in, out): one scale per column
    assert q.values.dtype == np.int8 and q.values.shape == w.shape and q.scale.shape == (1, 5)
    np.testing.assert_array_equal(np.abs(q.values).max(axis=0)[:4], 127)
    assert np.all(np.abs(np.asarray(q.dequantize()) - w) <= q.scale / 2 + 1e-6)
    np.testing.assert_array_equal(np.asarray(q.dequantize())[:, 4], 0.0)
    rows = quantize_matrix(w, reduce_axis=1)  # an embedding table: one scale per row
    assert rows.scale.shape == (6, 1)


def test_every_matrix_is_int8_and_vectors_stay_float():
    params = random_params(CONFIG.replace(positional="learned"), "seq2seq")
    quantised = quantize_params(params)
    is_q = lambda x: isinstance(x, Int8Matrix)  # noqa: E731
    flat = jax.tree_util.tree_flatten_with_path(quantised, is_leaf=is_q)[0]
    names = {jax.tree_util.keystr(path): leaf for path, leaf in flat}
    assert isinstance(names["['pos_embed']['weight']"], Int8Matrix)
    assert names["['src_embed']['embedding']"].scale.shape == (CONFIG.src_vocab_size, 1)
    kernel = names["['encoder']['layers_0']['ffn']['linear1']['kernel']"]
    assert kernel.scale.shape == (1, CONFIG.d_ff)
    for name, leaf in names.items():  # matrices int8, vectors (biases, norms) float32
        assert isinstance(leaf, Int8Matrix) or (leaf.ndim == 1 and leaf.dtype == np.float32), name
    matrices = [x for x in jax.tree.leaves(params) if x.ndim == 2]
    vectors = [x for x in jax.tree.leaves(params) if x.ndim == 1]
    scales = sum(q.scale.size for q in names.values() if isinstance(q, Int8Matrix))
    expected = sum(m.size for m in matrices) + 4 * scales + sum(v.nbytes for v in vectors)
    assert tree_nbytes(quantised) == expected < 0.3 * tree_nbytes(params)


def test_int8_model_stays_int8_into_jit_and_is_close():
    model = model_for(CONFIG, "seq2seq")
    variables = {"params": random_params(CONFIG, "seq2seq")}
    quantised = quantize_variables(variables)
    src = np.random.default_rng(1).integers(3, 259, (2, 9)).astype(np.int32)
    forward = jax.jit(lambda v, s, t: int8_model(model).apply(v, s, t))
    lowered = forward.lower(quantised, src, src).as_text()
    assert "xi8>" in lowered  # the int8 matrices are the jitted function's inputs
    got = forward(quantised, src, src)
    want = jax.jit(lambda v, s, t: model.apply(v, s, t))(variables, src, src)
    error = float(np.abs(got - want).max() / np.abs(want).max())
    assert 0 < error < 0.02  # int8 rounding: not bit-equal, but close


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
    return fabricate_run(tmp_path_factory.mktemp("runs") / "seq2seq", "seq2seq")


def test_generate_int8(seq2seq_run, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nabc\n"))
    assert generate_main(["--workdir", str(seq2seq_run), "--max-new-tokens", "6", "--int8"]) == 0
    out = capsys.readouterr().out.split("\n")[:2]
    run = load_run(seq2seq_run)
    tok = run.tokenizer
    src = np.zeros((2, 16), np.int32)  # the batch the command decodes: one 16-wide bucket
    for row, line in enumerate(["hello", "abc"]):
        ids = tok.encode(line) + [tok.eos_id]
        src[row, : len(ids)] = ids
    tokens = generate(
        int8_model(run.model), quantize_variables(run.params), src, Greedy(),
        max_new_tokens=6, bos_id=1, eos_id=2,
    )  # fmt: skip
    expected = []
    for row in np.asarray(tokens).tolist():
        row = row[: row.index(tok.eos_id)] if tok.eos_id in row else row
        expected.append(tok.decode(row).replace("\r", "\\r").replace("\n", "\\n"))
    assert out == expected


def test_generate_quantize_int8_uses_int8_products(seq2seq_run, monkeypatch, capsys):
    """`--quantize int8`: the same tokens as the library's generate on the int8-products model
    (nn.int8_products) with the same batch."""
    from flax_transformer.nn.int8_products import int8_products_model, quantize_for_products

    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nabc\n"))
    argv = ["--workdir", str(seq2seq_run), "--max-new-tokens", "6", "--quantize", "int8"]
    assert generate_main(argv) == 0
    out = capsys.readouterr().out.split("\n")[:2]
    run = load_run(seq2seq_run)
    tok = run.tokenizer
    src = np.zeros((2, 16), np.int32)
    for row, line in enumerate(["hello", "abc"]):
        ids = tok.encode(line) + [tok.eos_id]
        src[row, : len(ids)] = ids
    tokens = generate(
        int8_products_model(run.model), quantize_for_products(run.params), src, Greedy(),
        max_new_tokens=6, bos_id=1, eos_id=2,
    )  # fmt: skip
    expected = []
    for row in np.asarray(tokens).tolist():
        row = row[: row.index(tok.eos_id)] if tok.eos_id in row else row
        expected.append(tok.decode(row).replace("\r", "\\r").replace("\n", "\\n"))
    assert out == expected


def test_generate_quantize_bad_combinations_exit_2(seq2seq_run, capsys):
    base = ["--workdir", str(seq2seq_run)]
    for extra, message in (
        (["--int8", "--quantize", "int8"], "pick one"),
        (["--quantize", "int4"], "invalid choice: 'int4'"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            generate_main(base + extra)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
