"""The PyTorch twin with dynamic int8 quantisation of its Linear layers, the way PyTorch's own
tutorials deploy a Transformer: `quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`
(torch.ao.quantization's name for `torch.quantization.quantize_dynamic`). Linear weights are
int8 (one scale per tensor, PyTorch's default), activations are quantised per batch at run time;
embeddings stay float32 (quantize_dynamic has no dynamic int8 embedding).

Saved as TorchScript (`model_int8.pt`, torch.jit.trace_module), so loading needs torch only:

    model = torch.jit.load("model_int8.pt")
    logits = model(src, tgt_in)                       # int64 (B, S), (B, T) -> (B, T, V)
    encoded = model.encode(src); logits = model.decode(encoded, tgt_in, src_mask)
    # src_mask = (src != pad_id)[:, None, None, :];  an LM run: model(tokens)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch

from flax_transformer.export.greedy_loop import greedy_loop, lm_prompt_lengths, seq2seq_prompts
from flax_transformer.export.output import MANIFEST, check_float32, tensor_spec, write_manifest
from flax_transformer.export.torch_twin import example_tokens, torch_twin
from flax_transformer.spec.kinds import LM

TORCHSCRIPT = "model_int8.pt"


def quantize_twin(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation of every nn.Linear (a new module; `model` is left as it is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def trace(model: torch.nn.Module, config, kind: str):
    """TorchScript of forward (and, for seq2seq, encode and decode) with dynamic shapes."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python scalars (head_dim)
        if kind == LM:
            return torch.jit.trace_module(model, {"forward": (example_tokens(config),)})
        src, tgt = example_tokens(config, length=3), example_tokens(config, length=4)
        src_mask = (src != config.pad_id)[:, None, None, :]
        encoded = model.encode(src)
        methods = {"forward": (src, tgt), "encode": (src,), "decode": (encoded, tgt, src_mask)}
        return torch.jit.trace_module(model, methods)


def export_torch_int8(run, directory: Path) -> dict:
    """Writes model_int8.pt (TorchScript) and manifest.json into `directory`."""
    cfg = run.config
    check_float32(cfg, "torch-int8")
    traced = trace(quantize_twin(torch_twin(run)), cfg, run.model_kind)
    torch.jit.save(traced, str(directory / TORCHSCRIPT))
    logits = tensor_spec("logits", "float32", ["batch", "tgt_len", cfg.tgt_vocab_size])
    if run.model_kind == LM:
        inputs = [tensor_spec("tokens", "int64", ["batch", "tgt_len"])]
    else:
        inputs = [
            tensor_spec("src", "int64", ["batch", "src_len"]),
            tensor_spec("tgt_in", "int64", ["batch", "tgt_len"]),
        ]
    files = {"model": {"file": TORCHSCRIPT, "inputs": inputs, "outputs": [logits]}}
    return write_manifest(
        directory, run, "torch-int8", files, quantization="torch.ao dynamic qint8, nn.Linear"
    )


def greedy_torch(
    model, inputs: np.ndarray, *, kind: str, bos_id: int, eos_id: int, pad_id: int,
    max_new_tokens: int,
) -> np.ndarray:  # fmt: skip
    """Greedy decoding with a torch model (the twin, its quantised copy or the loaded
    TorchScript): new tokens (B, max_new_tokens), recomputing the decoder at every step."""
    inputs = torch.as_tensor(np.asarray(inputs, np.int64))
    loop = dict(max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id)
    with torch.no_grad():
        if kind == LM:

            def next_logits(prefix):
                return model(torch.from_numpy(prefix))[:, -1].numpy()

            prompts = inputs.numpy()
            return greedy_loop(next_logits, prompts, lm_prompt_lengths(prompts, pad_id), **loop)
        src_mask = (inputs != pad_id)[:, None, None, :]
        encoded = model.encode(inputs)

        def next_logits(prefix):
            return model.decode(encoded, torch.from_numpy(prefix), src_mask)[:, -1].numpy()

        return greedy_loop(next_logits, *seq2seq_prompts(len(inputs), bos_id), **loop)


def load_torch_int8(directory: Path):
    """(the TorchScript module, the manifest) of an exported directory."""
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    return torch.jit.load(str(directory / TORCHSCRIPT)), manifest
