"""A transformers tokenizer's load-time warnings are shown once per process, however often the
tokenizer is loaded (MarianTokenizer warns "Recommended: pip install sacremoses." at each)."""

from __future__ import annotations

import warnings

import pytest

from flax_transformer import hf
from flax_transformer.data.tokenizer import load_tokenizer
from flax_transformer.hf import tokenizer as hf_tokenizer
from tests import hf_models

SACREMOSES = "Recommended: pip install sacremoses."


def test_the_sacremoses_warning_is_shown_once_per_process(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    hf_dir = hf_models.save(hf_models.build("marian", seed=3), tmp_path / "hf", tokenizer=True)
    real = transformers.AutoTokenizer.from_pretrained

    def from_pretrained(*args, **kwargs):  # what MarianTokenizer does when it is built
        warnings.warn(SACREMOSES, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(hf_tokenizer, "_SHOWN_WARNINGS", set(), raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: once per place, until reset
        model = hf.load(hf_dir)
        tok = hf_tokenizer.HFTokenizer(
            model.tokenizer, pad_id=63, bos_id=63, eos_id=0, vocab_size=64
        )  # an import loads the tokenizer...
        tok.save(tmp_path / "run" / "tokenizer.json")
        with warnings.catch_warnings():  # as JAX and Orbax do between two loads: a reset
            pass
        again = load_tokenizer(tmp_path / "run" / "tokenizer.json")  # ...and its run again
        with warnings.catch_warnings():
            pass
        hf.load(hf_dir).tokenizer  # noqa: B018  (and a third load, through HFModel)
    assert again.encode("a b w3") == [2, 3, 31]  # the tokenizer still loads as before
    shown = [str(w.message) for w in caught if str(w.message) == SACREMOSES]
    assert shown == [SACREMOSES]


def test_other_load_warnings_are_shown_too(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    hf_dir = hf_models.save(hf_models.build("marian", seed=3), tmp_path / "hf", tokenizer=True)
    real = transformers.AutoTokenizer.from_pretrained

    def from_pretrained(*args, **kwargs):
        warnings.warn("first", UserWarning, stacklevel=1)
        warnings.warn("second", FutureWarning, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(hf_tokenizer, "_SHOWN_WARNINGS", set(), raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_tokenizer.load_pretrained_tokenizer(hf_dir)
        hf_tokenizer.load_pretrained_tokenizer(hf_dir)
    assert [(w.category, str(w.message)) for w in caught] == [
        (UserWarning, "first"),
        (FutureWarning, "second"),
    ]
