"""The Hugging Face family registry (flax_transformer/hf/families/): one module per family,
and no code outside it that asks which family a model is."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import numpy as np
import pytest

from flax_transformer.hf import config as hf_config_module
from flax_transformer.hf import families, weights
from flax_transformer.hf.families import FAMILIES, MODEL_TYPES, Family, family_for
from flax_transformer.hf.families.family import UnsupportedConfigError
from flax_transformer.spec.kinds import MODEL_KINDS

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "flax_transformer" / "hf"
FAMILY_MODULES = {"marian", "bart", "mbart", "gpt2", "t5", "bert", "roberta", "distilbert"}
FAMILY_MODULES |= {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"}


def test_the_registry_lists_exactly_the_sixteen_families():
    names = ["marian", "bart", "mbart", "gpt2", "t5", "bert", "roberta", "distilbert"]
    names += ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"]
    assert [f.name for f in FAMILIES] == names
    # T5's family reads all three, RoBERTa's XLM-RoBERTa too
    assert set(MODEL_TYPES) == FAMILY_MODULES | {"mt5", "umt5", "xlm-roberta"}
    for model_type in MODEL_TYPES:
        family = family_for(model_type)
        assert model_type in family.model_types
        assert sum(model_type in f.model_types for f in FAMILIES) == 1
        assert family.kind in MODEL_KINDS
    kinds = ["seq2seq", "seq2seq", "seq2seq", "lm", "seq2seq", "encoder", "encoder", "encoder"]
    kinds += ["lm"] * 8
    assert [f.kind for f in FAMILIES] == kinds
    t5 = family_for("t5")  # its bare encoders are the kind "encoder", by architecture
    assert t5.kind_for({"architectures": ["UMT5EncoderModel"]}) == "encoder"
    assert t5.kind_for({"architectures": ["MT5ForConditionalGeneration"]}) == "seq2seq"
    assert all(k in MODEL_KINDS for k in t5.architecture_kinds.values())


def test_one_module_per_family_each_holding_its_family():
    # what families share
    shared = {"__init__", "family", "seq2seq", "field_types", "bert_layout", "decoder_llm"}
    modules = {p.stem for p in (HF / "families").glob("*.py")} - shared
    assert modules == FAMILY_MODULES
    for name in modules:
        module = importlib.import_module(f"flax_transformer.hf.families.{name}")
        held = [v for v in vars(module).values() if isinstance(v, Family)]
        assert len(held) == 1 and held[0] is family_for(name), name


def test_an_unknown_model_type_names_the_supported_ones_and_where():
    for bad in ("t5x", None, 3):
        with pytest.raises(UnsupportedConfigError) as err:
            family_for(bad, where="x/config.json")
        assert str(err.value) == (
            f"x/config.json: model_type {bad!r} is not supported "
            "(supported: marian, bart, mbart, gpt2, t5, mt5, umt5, bert, roberta, xlm-roberta, "
            "distilbert, llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3)"
        )
    assert hf_config_module.UnsupportedConfigError is UnsupportedConfigError  # one class


def _hf_python_files():
    return [p for p in sorted(HF.rglob("*.py")) if "families" not in p.relative_to(HF).parts]


def family_branches(source: str, where: str) -> list[str]:
    """Each model-type literal and each comparison of a model_type in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and node.value in MODEL_TYPES:
            found.append(f"{line} the literal {node.value!r}")
        if isinstance(node, ast.Compare) and any(
            (isinstance(n, ast.Name) and n.id == "model_type")
            or (isinstance(n, ast.Attribute) and n.attr == "model_type")
            for n in (node.left, *node.comparators)
        ):
            found.append(f"{line} compares a model_type")
    return found


def test_no_model_type_branches_outside_the_registry():
    """Adding a family is adding one file: hf/ outside families/ names no model type and never
    compares a model_type."""
    found = []
    for path in _hf_python_files():
        found += family_branches(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "family branches outside hf/families/:\n" + "\n".join(found)


def test_the_branch_check_sees_the_branches_it_replaced():
    source = (
        'if self.model_type == "bart":\n    pass\n'
        'x = PREFIX[model_type] if model_type in ("mbart",) else None\n'
    )
    assert sorted(family_branches(source, "f.py")) == [
        "f.py:1 compares a model_type",
        "f.py:1 the literal 'bart'",
        "f.py:3 compares a model_type",
        "f.py:3 the literal 'mbart'",
    ]


def test_a_new_family_is_one_registry_entry(monkeypatch):
    """A family registered under a new model_type loads and saves through the same code: no
    other file needs to know it."""
    clone = dataclasses.replace(family_for("bart"), model_types=("bart_clone",))
    monkeypatch.setitem(families._BY_MODEL_TYPE, "bart_clone", clone)
    hf = dict(
        model_type="bart_clone",
        vocab_size=50,
        d_model=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=12,
        decoder_ffn_dim=12,
        max_position_embeddings=16,
        pad_token_id=1,
    )
    config, _ = hf_config_module.hf_to_config(hf)
    expected, _ = hf_config_module.hf_to_config({**hf, "model_type": "bart"})
    assert config == expected
    state = {
        "encoder.layers.0.ffn.linear1.weight": np.ones((12, 8)),
        "logits_bias.bias": np.zeros(50),
    }
    assert weights.canonical_to_hf(state, "bart_clone").keys() == {
        "model.encoder.layers.0.fc1.weight",
        "final_logits_bias",
    }


def test_generation_reads_the_position_table_length_from_the_family():
    assert family_for("marian").max_positions({"max_position_embeddings": 512}) == 512
    assert family_for("gpt2").max_positions({"n_positions": 1024}) == 1024
