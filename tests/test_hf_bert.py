"""The BERT family (BERT, RoBERTa, XLM-RoBERTa, DistilBERT: bare models and their heads)
against transformers: tiny random models transformers builds (tests/hf_models.py), saved with
save_pretrained, run on a right-padded batch with token types. float64 within 1e-12 of the
largest value over the real tokens, float32 within 1e-5; hf.save round trips bit-exact."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from flax_transformer import hf
from flax_transformer.spec.numerics import assert_close

from . import hf_models
from .hf_models import ENCODER_MODELS, encoder_only_batch

# The fast suite runs one class of each family; the rest are slow.
FAST = ("bert_sequence", "roberta_mlm", "distilbert_sequence")
SLOW = tuple(name for name in ENCODER_MODELS if name not in FAST)
ALL = [pytest.param(n) for n in FAST] + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW]


class Models(dict):
    """{name: (transformers model, its save_pretrained directory)}, built on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name):
        torch_model = hf_models.build_encoder_only(name)
        path = self.tmp_path_factory.mktemp(name)
        torch_model.save_pretrained(path)
        self[name] = (torch_model, path)
        return self[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory)


def _inputs(torch_model):
    pad = torch_model.config.pad_token_id
    types = torch_model.config.model_type != "distilbert"
    return encoder_only_batch(np.random.default_rng(0), pad, types)


def _expected(torch_model, ids, mask, types, dtype):
    model = torch_model.to(torch.float64 if dtype == "float64" else torch.float32)
    kwargs = {} if types is None else dict(token_type_ids=torch.from_numpy(types))
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **kwargs)
    torch_model.float()
    return out[0].numpy(), getattr(out, "pooler_output", None)


def _real(values, mask):
    """The values of real tokens only (a sequence head's are per row: all real)."""
    values = np.asarray(values)
    return values[mask == 1] if values.ndim == 3 else values


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_forward_matches_transformers(models, name, dtype):
    torch_model, path = models[name]
    ids, mask, types = _inputs(torch_model)
    expected, pooled = _expected(torch_model, ids, mask, types, dtype)
    with jax.enable_x64(dtype == "float64"):
        model = hf.load(path, dtype)
        out = model.forward(ids, attention_mask=mask, token_type_ids=types)
        assert out.shape == expected.shape
        rtol = 1e-12 if dtype == "float64" else 1e-5
        assert_close(_real(out, mask), _real(expected, mask), rtol=rtol, what=f"{name} {dtype}")
        if pooled is not None:
            ours = model.pooled_output(ids, attention_mask=mask, token_type_ids=types)
            assert_close(ours, pooled.numpy(), rtol=rtol, what=f"{name} pooler {dtype}")


@pytest.mark.parametrize("name", ALL)
def test_save_round_trips_bit_exact(models, name, tmp_path):
    """hf.save writes what from_pretrained of the same class reads: the same tensors, bit for
    bit, and the same outputs."""
    torch_model, path = models[name]
    out_dir = hf.save(hf.load(path), tmp_path / "saved")
    original, saved = (
        load_file(path / "model.safetensors"),
        load_file(out_dir / "model.safetensors"),
    )
    assert set(saved) <= set(original)
    for key, value in saved.items():
        np.testing.assert_array_equal(value, original[key], err_msg=key)
    reloaded = type(torch_model).from_pretrained(out_dir).eval()
    expected, reread = torch_model.state_dict(), reloaded.state_dict()
    assert set(reread) == set(expected)
    for key, value in expected.items():
        assert torch.equal(reread[key], value), key


def test_position_ids_and_left_padding(models):
    """RoBERTa's positions skip the padding (left-padded rows included); explicit
    position_ids are rows of the table, as in transformers."""
    torch_model, path = models["roberta_mlm"]
    model = hf.load(path)
    rng = np.random.default_rng(3)
    ids = rng.integers(3, 60, size=(2, 8))
    ids[0, :3] = 1  # left padding
    mask = (ids != 1).astype(np.int64)
    positions = np.tile(np.arange(2, 10), (2, 1))
    for kwargs in ({}, dict(position_ids=positions)):
        with torch.no_grad():
            t_kwargs = {k: torch.from_numpy(v) for k, v in kwargs.items()}
            expected = torch_model(torch.from_numpy(ids), torch.from_numpy(mask), **t_kwargs)
        out = model.forward(ids, attention_mask=mask, **kwargs)
        assert_close(out[mask == 1], expected[0].numpy()[mask == 1], rtol=1e-5, what=str(kwargs))


def test_bad_inputs_are_named(models):
    model = hf.load(models["distilbert_sequence"][1])
    ids = np.ones((1, 4), np.int64)
    with pytest.raises(ValueError, match="token_type_ids given to a distilbert model"):
        model.forward(ids, token_type_ids=ids)
    with pytest.raises(ValueError, match="has no pooler"):
        model.pooled_output(ids)


def test_encoder_fn_gives_the_hidden_states_under_a_head(models):
    """encoder_fn of a model with a head is its encoder's last hidden state, jittable."""
    torch_model, path = models["bert_sequence"]
    ids, mask, _ = _inputs(torch_model)
    hidden = jax.jit(hf.load(path).encoder_fn())(ids, mask)
    with torch.no_grad():
        expected = torch_model.bert(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
    assert_close(np.asarray(hidden)[mask == 1], expected[mask == 1], rtol=1e-5, what="hidden")


def test_import_export_round_trip_through_a_run_directory(models, tmp_path):
    """`hf import` then `hf export` gives back the same tensors, which the same transformers
    class reads."""
    from flax_transformer.cli.hf import main as hf_main
    from flax_transformer.runs.run_dir import read_run_json

    torch_model, path = models["roberta_sequence"]
    source = tmp_path / "hf"
    source.mkdir()
    for file in path.iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    hf_models.encoder_only_tokenizer(source)
    run = tmp_path / "run"
    assert hf_main(["import", str(source), str(run)]) == 0
    assert read_run_json(run)["model"] == "encoder"
    assert hf_main(["export", str(run), str(tmp_path / "out")]) == 0
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    reloaded = type(torch_model).from_pretrained(tmp_path / "out")
    assert reloaded.config.id2label == torch_model.config.id2label


def test_lengths_of_one_bucket_compile_once_and_match_transformers(models):
    """forward pads the tokens to their length bucket (hf.length_buckets): lengths 9 to 16
    share one compilation, each output as transformers' at its own length."""
    torch_model, path = models["roberta_mlm"]  # positions that skip padding: the pad id matters
    model = hf.load(path)
    rng = np.random.default_rng(4)
    for length in (9, 13, 16):
        ids = rng.integers(3, 60, size=(2, length))
        with torch.no_grad():
            expected = torch_model(torch.from_numpy(ids))[0].numpy()
        out = model.forward(ids)
        assert out.shape == expected.shape
        assert_close(out, expected, rtol=1e-5, what=f"length {length}")
    assert model._apply._cache_size() == 1
    model.forward(rng.integers(3, 60, size=(2, 17)))  # the next bucket: one more
    assert model._apply._cache_size() == 2
