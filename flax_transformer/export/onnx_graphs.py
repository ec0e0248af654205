"""ONNX graphs of a run, traced from the PyTorch twin with torch.onnx.export (its default,
torch.export-based exporter; it needs the onnxscript package). Opset 18, float32, dynamic batch
and lengths, int64 token ids padded with pad_id:

    model.onnx    seq2seq: src (batch, src_len), tgt_in (batch, tgt_len) -> logits
                  (batch, tgt_len, vocab);  LM: tokens (batch, length) -> logits
    encoder.onnx  seq2seq only: src -> encoded (batch, src_len, d_model)
    decoder.onnx  seq2seq only: encoded, src, tgt_in -> logits (src masks the padded keys)

The graphs recompute the decoder over the whole prefix (no KV cache inputs): `greedy_onnx`
decodes with them as `decoding.generate(..., Greedy())` does.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np

from flax_transformer.export.greedy_loop import greedy_loop, lm_prompt_lengths, seq2seq_prompts
from flax_transformer.export.output import (
    MANIFEST,
    ExportError,
    check_float32,
    tensor_spec,
    write_manifest,
)
from flax_transformer.spec.kinds import LM

OPSET = 18
MODEL, ENCODER, DECODER = "model.onnx", "encoder.onnx", "decoder.onnx"
INSTALL_HINT = "pip install 'flax-transformer[export]' (or: pip install onnx onnxscript)"


def require_onnx_exporter() -> None:
    """torch.onnx's default exporter needs onnx and onnxscript; say what to install."""
    missing = []
    for name in ("onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ExportError(f"--format onnx needs {' and '.join(missing)}: {INSTALL_HINT}")


def _export(module, args, names_in, names_out, dynamic, path: Path, opset: int) -> None:
    import torch

    # The exporter reports its progress and deprecations on stdout/stderr, and logs four lines
    # a graph about torchvision operators it skips (torchvision is not a dependency here);
    # keep the CLI quiet.
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module, args, None, dynamo=True, input_names=names_in, output_names=names_out,
                dynamic_shapes=dynamic, opset_version=opset, verbose=False,
            )  # fmt: skip
    finally:
        registration.setLevel(level)
    program.save(str(path))


def export_onnx(run, directory: Path, *, opset: int = OPSET) -> dict:
    """Writes the graphs (see the module docstring) and manifest.json into `directory`."""
    require_onnx_exporter()
    import torch

    from flax_transformer.export.torch_twin import (
        DecoderGraph,
        EncoderGraph,
        example_tokens,
        torch_twin,
    )

    cfg = run.config
    check_float32(cfg, "onnx")
    twin = torch_twin(run)
    Dim = torch.export.Dim
    batch, src_len, tgt_len = (
        Dim("batch"),
        Dim("src_len", max=cfg.max_len),
        Dim("tgt_len", max=cfg.max_len),
    )
    V, d = cfg.tgt_vocab_size, cfg.d_model
    logits = tensor_spec("logits", "float32", ["batch", "tgt_len", V])
    with torch.no_grad():
        if run.model_kind == LM:
            tokens = example_tokens(cfg)
            _export(
                twin,
                (tokens,),
                ["tokens"],
                ["logits"],
                ({0: batch, 1: tgt_len},),
                directory / MODEL,
                opset,
            )
            files = {
                "model": {
                    "file": MODEL,
                    "inputs": [tensor_spec("tokens", "int64", ["batch", "tgt_len"])],
                    "outputs": [logits],
                }
            }
        else:
            src, tgt = example_tokens(cfg, length=3), example_tokens(cfg, length=4)
            s_dims, t_dims = {0: batch, 1: src_len}, {0: batch, 1: tgt_len}
            _export(
                twin,
                (src, tgt),
                ["src", "tgt_in"],
                ["logits"],
                (s_dims, t_dims),
                directory / MODEL,
                opset,
            )
            _export(
                EncoderGraph(twin),
                (src,),
                ["src"],
                ["encoded"],
                (s_dims,),
                directory / ENCODER,
                opset,
            )
            encoded = twin.encode(src)
            _export(
                DecoderGraph(twin), (encoded, src, tgt), ["encoded", "src", "tgt_in"], ["logits"],
                (s_dims, s_dims, t_dims), directory / DECODER, opset,
            )  # fmt: skip
            src_spec = tensor_spec("src", "int64", ["batch", "src_len"])
            tgt_spec = tensor_spec("tgt_in", "int64", ["batch", "tgt_len"])
            encoded_spec = tensor_spec("encoded", "float32", ["batch", "src_len", d])
            files = {
                "model": {"file": MODEL, "inputs": [src_spec, tgt_spec], "outputs": [logits]},
                "encoder": {"file": ENCODER, "inputs": [src_spec], "outputs": [encoded_spec]},
                "decoder": {
                    "file": DECODER,
                    "inputs": [encoded_spec, src_spec, tgt_spec],
                    "outputs": [logits],
                },
            }
    return write_manifest(directory, run, "onnx", files, opset=opset)


def greedy_onnx(directory: Path, inputs: np.ndarray, *, max_new_tokens: int) -> np.ndarray:
    """Greedy decoding with an exported directory's graphs in onnxruntime: new tokens
    (B, max_new_tokens). inputs: a seq2seq run's src (B, S), or an LM's right-padded prompts."""
    import onnxruntime as ort

    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    ids = manifest["tokens"]
    inputs = np.asarray(inputs, np.int64)
    session = lambda name: ort.InferenceSession(
        str(directory / name), providers=["CPUExecutionProvider"]
    )  # noqa: E731
    loop = dict(max_new_tokens=max_new_tokens, eos_id=ids["eos_id"], pad_id=ids["pad_id"])
    if manifest["model_kind"] == LM:
        model = session(MODEL)
        next_logits = lambda prefix: model.run(None, {"tokens": prefix})[0][:, -1]  # noqa: E731
        return greedy_loop(next_logits, inputs, lm_prompt_lengths(inputs, ids["pad_id"]), **loop)
    encoder, decoder = session(ENCODER), session(DECODER)
    (encoded,) = encoder.run(None, {"src": inputs})
    feeds = {"encoded": encoded, "src": inputs}
    next_logits = lambda prefix: decoder.run(None, {**feeds, "tgt_in": prefix})[0][:, -1]  # noqa: E731
    return greedy_loop(next_logits, *seq2seq_prompts(len(inputs), ids["bos_id"]), **loop)
