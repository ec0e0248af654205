"""The peers of `bench.encoder`: the random checkpoint, ONNX Runtime and CTranslate2's Encoder.

Each peer takes a batch of token ids (batch, len) with every token real and returns the last
hidden state (batch, len, d_model) as float32 numpy, so the bench compares and times them alike.

- ONNX Runtime: transformers' model exported with `torch.onnx.export` (its default,
  torch.export-based exporter, opset 18, dynamic batch and length), run with every graph
  optimisation on (ORT_ENABLE_ALL: attention, LayerNorm and GELU fusions), intra-op threads =
  the CPU count.
- CTranslate2: the checkpoint converted with its own TransformersConverter (float32, once),
  loaded as `ctranslate2.Encoder` with compute_type float32 or int8 (CTranslate2 quantises the
  weights itself). The bench's checkpoints have no tokenizer: the converter is given a
  stand-in vocabulary (token i named `t{i}`); ids go in as ids.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import numpy as np

# transformers' config class, model class and the sizes' names, per --model.
ARCHITECTURES = {
    "bert": ("BertConfig", "BertModel"),
    "roberta": ("RobertaConfig", "RobertaModel"),
    "distilbert": ("DistilBertConfig", "DistilBertModel"),
}


def make_checkpoint(directory: Path, architecture: str, sizes: dict) -> None:
    """A random transformers encoder (the bare model, as saved by save_pretrained)."""
    import torch
    import transformers

    config_class, model_class = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**sizes)
    getattr(transformers, model_class)(config).eval().save_pretrained(directory)


def torch_model(directory: Path):
    """transformers' model from `directory`, float32, in eval mode."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(directory).eval()


def last_hidden_module(model):
    """A torch module around transformers' `model`: (input_ids, attention_mask) -> its last
    hidden state (the exporter traces tensors in, one tensor out)."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state

    return LastHidden()


def export_onnx(model, path: Path, max_len: int) -> Path:
    """transformers' `model` as an ONNX graph (dynamic batch and length up to `max_len`)."""
    import torch

    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=max_len)
    # Two different example tensors: the exporter aliases inputs passed as one tensor.
    ids = torch.randint(5, 60, (2, 16))
    mask = torch.ones((2, 16), dtype=torch.long)
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)  # four lines about torchvision, not installed
    try:
        with (
            torch.no_grad(),
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                last_hidden_module(model), (ids, mask), None, dynamo=True,
                input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}), opset_version=18,
                verbose=False,
            )  # fmt: skip
    finally:
        registration.setLevel(level)
    program.save(str(path))
    return path


class OrtPeer:
    """An ONNX Runtime session over the exported graph, every graph optimisation on."""

    def __init__(self, onnx_path: Path, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = ids.astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        return self.session.run(["last_hidden_state"], feeds)[0]


class _StandInTokenizer:
    """What CTranslate2's encoder loaders read from a tokenizer: the vocabulary, the UNK name."""

    unk_token = "<unk>"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {("<unk>" if i == 0 else f"t{i}"): i for i in range(self.vocab_size)}


def convert_ct2(hf_dir: Path, out_dir: Path, vocab_size: int) -> Path:
    """The checkpoint converted by CTranslate2's TransformersConverter (float32)."""
    from ctranslate2.converters import TransformersConverter

    class _Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _StandInTokenizer(vocab_size)

        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            # transformers 5 dropped the field CTranslate2's BERT and RoBERTa loaders check;
            # these models' positions are absolute.
            model.config.position_embedding_type = "absolute"
            return model

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Path(_Converter(str(hf_dir)).convert(str(out_dir), force=True))


class CT2Peer:
    """CTranslate2's Encoder over the converted model; ids in, the last hidden state out."""

    def __init__(self, model_dir: Path, compute_type: str, threads: int):
        import ctranslate2

        self.encoder = ctranslate2.Encoder(
            str(model_dir), device="cpu", compute_type=compute_type, inter_threads=1,
            intra_threads=threads,
        )  # fmt: skip

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        out = self.encoder.forward_batch(ids.tolist())
        return np.asarray(out.last_hidden_state, np.float32)


def missing(modules: tuple[str, ...], columns: str) -> str | None:
    """None when every module imports, else one line saying `columns` are skipped and why."""
    for module in modules:
        try:
            __import__(module)
        except ImportError as err:
            return (
                f"{module} is not installed ({err}); the {columns} columns are skipped "
                "(pip install 'flax-transformer[bench]')"
            )
    return None
