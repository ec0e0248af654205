"""The torch-based exports round-trip. ONNX: onnxruntime gives the Flax model's logits
(float32, 1e-5 relative) and, decoding greedily with the encoder / decoder graphs, its tokens;
dynamic batch and lengths, the documented names and opset. torch-int8: the TorchScript file
gives what the quantised twin gives (logits and greedy tokens)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from flax_transformer.cli.export import main
from flax_transformer.decoding import Greedy, generate
from flax_transformer.export.onnx_graphs import OPSET, greedy_onnx
from flax_transformer.export.stablehlo import forward_function
from flax_transformer.export.torch_int8 import greedy_torch, load_torch_int8, quantize_twin
from flax_transformer.export.torch_twin import torch_twin
from flax_transformer.runs.load import load_run
from tests.export_runs import fabricate_run, lm_prompts, source_batch

pytestmark = pytest.mark.slow
N_NEW = 7
SHAPES = [(2, 5), (3, 11)]  # (batch, length): two of each


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {kind: fabricate_run(root / kind, kind) for kind in ("seq2seq", "lm")}


def relative_error(got, want) -> float:
    return float(np.abs(np.asarray(got) - np.asarray(want)).max() / np.abs(want).max())


def graph_io(path) -> dict[str, list]:
    """{name: [dim name or size, ...]} of a graph's inputs and outputs."""
    graph = onnx.load(str(path)).graph
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }


def test_onnx_seq2seq(runs, tmp_path):
    out = tmp_path / "onnx"
    assert main([str(runs["seq2seq"]), "--format", "onnx", "--out", str(out)]) == 0
    model = onnx.load(str(out / "model.onnx"))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    assert graph_io(out / "model.onnx") == {
        "src": ["batch", "src_len"], "tgt_in": ["batch", "tgt_len"],
        "logits": ["batch", "tgt_len", 259],
    }  # fmt: skip
    assert set(graph_io(out / "encoder.onnx")) == {"src", "encoded"}
    assert set(graph_io(out / "decoder.onnx")) == {"encoded", "src", "tgt_in", "logits"}
    assert json.loads((out / "manifest.json").read_text())["opset"] == OPSET
    run = load_run(runs["seq2seq"])
    forward = forward_function(run.model, run.params)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in SHAPES:
        src, tgt = source_batch(batch, length, seed=length), lm_prompts(batch, length - 2, 1)
        (logits,) = session.run(None, {"src": src.astype(np.int64), "tgt_in": tgt.astype(np.int64)})
        assert relative_error(logits, forward(src, tgt)) <= 1e-5
        tokens = greedy_onnx(out, src, max_new_tokens=N_NEW)
        want = generate(
            run.model, run.params, src, Greedy(), max_new_tokens=N_NEW, bos_id=1, eos_id=2
        )
        np.testing.assert_array_equal(tokens, want)


def test_onnx_lm(runs, tmp_path):
    out = tmp_path / "onnx"
    assert main([str(runs["lm"]), "--format", "onnx", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "model.onnx",
        "tokenizer.json",
    ]
    assert graph_io(out / "model.onnx")["tokens"] == ["batch", "tgt_len"]
    run = load_run(runs["lm"])
    forward = forward_function(run.model, run.params)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in SHAPES:
        prompts = lm_prompts(batch, length, seed=length)
        (logits,) = session.run(None, {"tokens": prompts.astype(np.int64)})
        assert relative_error(logits, forward(prompts)) <= 1e-5
        tokens = greedy_onnx(out, prompts, max_new_tokens=N_NEW)
        want = generate(run.model, run.params, prompts, Greedy(), max_new_tokens=N_NEW, eos_id=2)
        np.testing.assert_array_equal(tokens, want)


def test_torch_int8(runs, tmp_path):
    out = tmp_path / "int8"
    assert main([str(runs["seq2seq"]), "--format", "torch-int8", "--out", str(out)]) == 0
    loaded, manifest = load_torch_int8(out)
    run = load_run(runs["seq2seq"])
    quantised = quantize_twin(torch_twin(run))
    assert isinstance(quantised.encoder.layers[0].ffn.linear1, torch.ao.nn.quantized.dynamic.Linear)
    ids = dict(bos_id=1, eos_id=2, pad_id=0, max_new_tokens=N_NEW, kind=manifest["model_kind"])
    for batch, length in SHAPES:
        src, tgt = source_batch(batch, length, seed=length), lm_prompts(batch, length - 2, 1)
        args = torch.from_numpy(src).long(), torch.from_numpy(tgt).long()
        with torch.no_grad():
            assert relative_error(loaded(*args).numpy(), quantised(*args).numpy()) <= 1e-6
        tokens = greedy_torch(loaded, src, **ids)
        np.testing.assert_array_equal(tokens, greedy_torch(quantised, src, **ids))


@pytest.mark.slow  # an ONNX export in a process of its own (about 20 s)
def test_ftx_export_onnx_prints_only_its_result(runs, tmp_path):
    """torch's exporter logged four "torchvision is not installed. Skipping torchvision::..."
    lines a graph (a dozen in all) on a newcomer's terminal; the command prints its one line."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "onnx"
    argv = ["export", "--workdir", str(runs["lm"]), "--format", "onnx", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "flax_transformer.cli", *argv], cwd=root,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchvision" not in done.stderr and done.stderr.strip() == "", done.stderr[-3000:]
    assert done.stdout.startswith(f"onnx: {out} (")
