"""hf.xla_cpu: a float32 encoder's forward compiles without YNNPACK on the CPU; other programs
keep XLA's defaults."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flax_transformer import hf
from flax_transformer.hf.xla_cpu import ENCODER_COMPILER_OPTIONS, encoder_compiler_options


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("bert")
    transformers.BertModel(config).eval().save_pretrained(path)
    return path


def _compiled_text(apply, model) -> str:
    ids = np.ones((2, 16), np.int32)
    mask = np.ones((2, 1, 1, 16), bool)
    return apply.lower(model.variables, ids, src_mask=mask).compile().as_text()


def test_encoder_compiler_options_only_for_float32_on_the_cpu():
    assert jax.default_backend() == "cpu"
    assert encoder_compiler_options(True) == ENCODER_COMPILER_OPTIONS
    assert encoder_compiler_options(False) is None


def test_float32_encoder_forward_compiles_without_ynnpack(tiny_bert):
    model = hf.load(tiny_bert)
    assert "ynn_fusion" in _compiled_text(jax.jit(model.module.apply), model)  # the default
    assert "ynn_fusion" not in _compiled_text(model._apply, model)
    with jax.enable_x64(True):  # float64 (the exactness tests' dtype) keeps XLA's defaults
        float64 = hf.load(tiny_bert, dtype="float64")
        assert "ynn_fusion" in _compiled_text(float64._apply, float64)
