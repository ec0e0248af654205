"""BERT-family checkpoints as the Hub holds them: files saved from another class of the family
(bert-base-uncased is BertForPreTraining's: the next-sentence head `cls.seq_relationship`, the
masked LM head `cls.predictions`), old `position_ids` buffers, keys with and without the
`bert.` prefix, TensorFlow-era `LayerNorm.gamma` / `beta` names. hf.load reads them as
transformers' from_pretrained of config.json's class does (float64, within 1e-12 of the
largest value over the real tokens), names the tensors it ignored in one warning, and still
refuses any other unexpected key and a missing head."""

from __future__ import annotations

import json
import re
import warnings

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from flax_transformer import hf
from flax_transformer.hf.families import family_for
from flax_transformer.hf.weights import loaded_names, unused_keys
from flax_transformer.spec.numerics import assert_close
from flax_transformer.spec.tree_check import ConversionError

from .hf_models import encoder_only_batch, encoder_only_config

NSP = ["cls.seq_relationship.bias", "cls.seq_relationship.weight"]
MLM = [
    "cls.predictions.bias",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.dense.weight",
]
POOLER = ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]


def _perturbed(model):
    """`model` in eval mode with every weight moved off transformers' init (LayerNorms too)."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """A tiny random BertForPreTraining saved with save_pretrained (its file: the encoder, the
    pooler, cls.predictions, cls.seq_relationship), and its state dict."""
    torch.manual_seed(0)
    model = _perturbed(transformers.BertForPreTraining(encoder_only_config("bert")))
    path = tmp_path_factory.mktemp("pretraining")
    model.save_pretrained(path)
    return path, {k: v.numpy() for k, v in model.state_dict().items()}


def _as_class(
    source, path, architecture, extra=None, drop=(), strip_prefix=False, legacy_norms=False
):
    """A copy of the save_pretrained directory `source` whose config.json names
    `architecture`, with `extra` tensors added, `drop` removed, the `bert.` prefix cut from
    every key when `strip_prefix` (a base model saved bare), and the LayerNorms' weight and
    bias named gamma and beta when `legacy_norms` (bert-base-uncased's files)."""
    path.mkdir()
    config = json.loads((source / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    state = {k: v for k, v in load_file(source / "model.safetensors").items() if k not in drop}
    state.update(extra or {})
    if strip_prefix:
        state = {k.removeprefix("bert."): v for k, v in state.items()}
    if legacy_norms:
        old = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
        state = {
            re.sub(r"LayerNorm\.(weight|bias)", lambda m: old[m[0]], k): v for k, v in state.items()
        }
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _load_warned(path):
    """hf.load(path) in float64 and the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = hf.load(path, "float64")
    return model, [str(w.message) for w in caught]


def _assert_ignored(messages, path, architecture, keys):
    """The warnings name `keys` (sorted) in one "ignored" warning about `path`'s weights, or
    give none when `keys` is empty."""
    found = [m for m in messages if "transformers does not use" in m]
    expected = (
        f"{path / 'model.safetensors'}: ignored {len(keys)} tensor(s) transformers does not use "
        f"for {architecture}: " + ", ".join(sorted(keys))
    )
    assert found == ([expected] if keys else [])


def _check_outputs(path, architecture, model):
    """hf.load's forward (and pooler) against transformers' from_pretrained of the class, on
    a right-padded batch with token types, float64."""
    reference = getattr(transformers, architecture).from_pretrained(path).eval().double()
    ids, mask, types = encoder_only_batch(np.random.default_rng(0), pad=0)
    with torch.no_grad():
        out = reference(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            token_type_ids=torch.from_numpy(types),
        )
    ours = model.forward(ids, attention_mask=mask, token_type_ids=types)
    expected = out[0].numpy()
    real = (lambda a: a[mask == 1]) if expected.ndim == 3 else (lambda a: a)
    assert_close(real(ours), real(expected), rtol=1e-12, what=architecture)
    if getattr(out, "pooler_output", None) is not None:
        pooled = model.pooled_output(ids, attention_mask=mask, token_type_ids=types)
        assert_close(pooled, out.pooler_output.numpy(), rtol=1e-12, what="pooler")


@pytest.mark.parametrize(
    ("architecture", "ignored", "legacy_norms"),
    [("BertModel", MLM + NSP, False), ("BertForMaskedLM", POOLER + NSP, True)],
)
def test_a_pretraining_file_loads_as_the_class_config_names(
    pretraining, tmp_path, architecture, ignored, legacy_norms
):
    """bert-base-uncased's case: the heads the class has no place for are ignored, named;
    its LayerNorm.gamma / beta names read as transformers renames them."""
    path = _as_class(pretraining[0], tmp_path / "hub", architecture, legacy_norms=legacy_norms)
    assert any(k.endswith(".gamma") for k in load_file(path / "model.safetensors")) == legacy_norms
    with jax.enable_x64(True):
        model, messages = _load_warned(path)
        _assert_ignored(messages, path, architecture, ignored)
        _check_outputs(path, architecture, model)


def test_a_classifier_file_with_pretraining_heads_and_an_old_buffer(pretraining, tmp_path):
    """A fine-tuned classifier whose file kept the pretraining heads and the position_ids
    buffer of older transformers versions (int64, ignored without a word as there)."""
    _, state = pretraining
    torch.manual_seed(1)
    classifier = transformers.BertForSequenceClassification(encoder_only_config("bert"))
    source = tmp_path / "classifier"
    _perturbed(classifier).save_pretrained(source)
    extra = {k: state[k] for k in NSP + MLM}
    extra["bert.embeddings.position_ids"] = np.arange(40, dtype=np.int64)[None]
    architecture = "BertForSequenceClassification"
    path = _as_class(source, tmp_path / "hub", architecture, extra=extra)
    with jax.enable_x64(True):
        model, messages = _load_warned(path)
        _assert_ignored(messages, path, architecture, MLM + NSP)
        _check_outputs(path, architecture, model)


def test_a_base_model_saved_bare_with_an_old_buffer(pretraining, tmp_path):
    """BertModel's own file (keys without `bert.`, position_ids kept): nothing to warn about."""
    path = _as_class(
        pretraining[0],
        tmp_path / "hub",
        "BertModel",
        extra={"bert.embeddings.position_ids": np.arange(40, dtype=np.int64)[None]},
        drop=MLM + NSP,
        strip_prefix=True,
    )
    assert "embeddings.word_embeddings.weight" in load_file(path / "model.safetensors")
    with jax.enable_x64(True):
        model, messages = _load_warned(path)
        _assert_ignored(messages, path, "BertModel", [])
        _check_outputs(path, "BertModel", model)


def test_a_missing_head_is_an_error_naming_it(pretraining, tmp_path):
    """A file without the head (or pooler) of the class config.json names (a base model's or
    another head's file) is refused, naming them (transformers would initialise them at
    random)."""
    classifier = ["classifier.bias", "classifier.weight"]
    cases = [  # (file, config.json's class, what is missing)
        (dict(drop=MLM + NSP, strip_prefix=True), "BertForSequenceClassification", classifier),
        ({}, "BertForTokenClassification", classifier),
        (dict(drop=POOLER + NSP), "BertModel", POOLER),  # BertForMaskedLM's file
    ]
    for n, (file, architecture, missing) in enumerate(cases):
        path = _as_class(pretraining[0], tmp_path / str(n), architecture, **file)
        with pytest.raises(ConversionError) as err, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf.load(path)
        message = str(err.value)
        assert message.startswith(f"{path / 'model.safetensors'}: 2 problem(s):")
        for key in missing:
            assert f"missing tensor {key!r} (expected shape" in message
        part = "pooler" if missing == POOLER else "head"
        assert (
            f"config.json's architectures name {architecture}, whose {part} the file does not "
            f"hold ({', '.join(missing)} missing): it was saved from another class"
        ) in message


def test_any_other_unexpected_key_is_still_an_error(pretraining, tmp_path):
    """Only the family's other classes' weights are ignored: anything else is named."""
    _, state = pretraining
    extra = {
        "bert.encoder.layer.9.foo": np.zeros(3, np.float32),
        "cls.predictions.extra.weight": np.zeros(3, np.float32),
    }
    path = _as_class(pretraining[0], tmp_path / "hub", "BertForMaskedLM", extra=extra)
    with pytest.raises(ConversionError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.load(path)
    message = str(err.value)
    assert message.startswith(f"{path / 'model.safetensors'}: 2 problem(s):")
    assert "unexpected tensor 'bert.encoder.layer.9.foo' (shape (3,))" in message
    assert "unexpected tensor 'cls.predictions.extra.weight' (shape (3,))" in message
    assert "seq_relationship" not in message and "pooler" not in message


@pytest.mark.parametrize(
    ("model_type", "architecture", "file", "expected", "unused"),
    [
        (  # roberta-base is RobertaForMaskedLM's file
            "roberta",
            "RobertaForSequenceClassification",
            [
                "lm_head.dense.weight",
                "lm_head.bias",
                "lm_head.decoder.weight",
                "roberta.pooler.dense.bias",
                "x.weight",
            ],
            ["roberta.embeddings.word_embeddings.weight", "classifier.dense.weight"],
            # lm_head.decoder.weight: a tied copy of the word embeddings, dropped silently
            ["lm_head.bias", "lm_head.dense.weight", "roberta.pooler.dense.bias"],
        ),
        (  # a classifier's file read as the base model
            "xlm-roberta",
            "XLMRobertaModel",
            ["classifier.dense.bias", "classifier.out_proj.weight", "roberta.pooler.dense.weight"],
            ["roberta.pooler.dense.weight"],
            ["classifier.dense.bias", "classifier.out_proj.weight"],
        ),
        (  # distilbert-base-uncased is DistilBertForMaskedLM's file
            "distilbert",
            "DistilBertForSequenceClassification",
            [
                "vocab_transform.weight",
                "vocab_layer_norm.bias",
                "vocab_projector.weight",
                "classifier.weight",
                "distilbert.embeddings.word_embeddings.weight",
            ],
            ["classifier.weight", "pre_classifier.weight"],
            ["vocab_layer_norm.bias", "vocab_projector.weight", "vocab_transform.weight"],
        ),
        (  # a base model saved bare: the keys are read with the prefix
            "bert",
            "BertForMaskedLM",
            ["embeddings.word_embeddings.weight", "pooler.dense.weight"],
            ["bert.embeddings.word_embeddings.weight"],
            ["pooler.dense.weight"],
        ),
    ],
)
def test_the_family_data_names_the_other_classes_weights(
    model_type, architecture, file, expected, unused
):
    hf_config = {"model_type": model_type, "architectures": [architecture]}
    state = dict.fromkeys(file, np.zeros(1, np.float32))
    assert unused_keys(state, hf_config, expected) == sorted(unused)


def test_a_tensor_under_its_old_and_new_name_is_an_error():
    state = dict.fromkeys(["bert.embeddings.LayerNorm.gamma", "bert.embeddings.LayerNorm.weight"])
    with pytest.raises(ConversionError, match=r"^w: tensors stored twice.*LayerNorm\.gamma, "):
        loaded_names(state, family_for("bert"), "w")
