"""HFModel.generate against transformers' own generate: token-identical, both sides float64
(random models have near-ties that float32 rounding can flip), tiny random models saved with
save_pretrained. EOS is made reachable by choosing as EOS a token the model does produce, so
rows finish at different steps and the pad fill is exercised."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from tests.hf_models import build, ragged_batch, save

NEW = 10  # new tokens per generate call


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{model_type: (transformers model in float64, HFModel in float64)}."""
    from flax_transformer import hf

    out = {}
    with jax.enable_x64(True):
        for model_type in ("marian", "bart", "gpt2"):
            # Weights larger than transformers' init: the outputs depend on the input.
            init = {"initializer_range" if model_type == "gpt2" else "init_std": 0.5}
            torch_model = build(model_type, seed=1, **init)
            path = save(torch_model, tmp_path_factory.mktemp(model_type))
            out[model_type] = (torch_model.double(), hf.load(path, dtype="float64"))
    return out


def batch_for(model_type: str, flax_model, seed: int = 0):
    """A ragged batch: right-padded sources for seq2seq, left-padded prompts for GPT-2."""
    rng = np.random.default_rng(seed)
    cfg = flax_model.config
    if model_type == "gpt2":
        ids, mask = ragged_batch(rng, cfg.tgt_vocab_size, (6, 3, 5, 1), pad=0)
        return ids[:, ::-1].copy(), mask[:, ::-1].copy()
    return ragged_batch(rng, cfg.src_vocab_size, (9, 4, 7, 2), pad=cfg.pad_id)


def hf_generate(torch_model, ids, mask, **kwargs) -> np.ndarray:
    with torch.no_grad():
        out = torch_model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **kwargs
        )
    return out.numpy()


def reachable_eos(torch_model, ids, mask, prompt_len: int, **kwargs) -> int:
    """A token the model emits early in some rows but not in all: as EOS it ends rows at
    different steps."""
    free = hf_generate(torch_model, ids, mask, max_new_tokens=NEW, min_new_tokens=NEW, **kwargs)
    new = free[:, prompt_len:]

    def end_steps(token):  # the distinct steps at which rows would end
        first = [np.flatnonzero(row == token) for row in new]
        return {int(f[0]) if len(f) else NEW for f in first}

    token = max(np.unique(new[:, : NEW - 2]).tolist(), key=lambda t: len(end_steps(t)))
    assert len(end_steps(token)) > 1, f"no token ends rows at different steps: {new.tolist()}"
    return int(token)


def assert_same(ours: np.ndarray, theirs: np.ndarray):
    assert ours.dtype == np.int64
    assert ours.shape == theirs.shape, (ours.tolist(), theirs.tolist())
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("model_type", ["marian", "bart", "gpt2"])
def test_greedy_token_identical_with_eos(models, model_type):
    torch_model, flax_model = models[model_type]
    ids, mask = batch_for(model_type, flax_model)
    prompt_len = ids.shape[1] if model_type == "gpt2" else 1
    eos = reachable_eos(torch_model, ids, mask, prompt_len)
    kwargs = dict(max_new_tokens=NEW, eos_token_id=eos)
    with jax.enable_x64(True):
        ours = flax_model.generate(ids, mask, **kwargs)
    theirs = hf_generate(torch_model, ids, mask, **kwargs)
    assert_same(ours, theirs)
    if model_type != "gpt2":  # seq2seq rows start with the decoder start token
        assert (ours[:, 0] == flax_model.config.decoder_start_id).all()
    else:  # GPT-2 rows are the left-padded prompt, then the continuation
        np.testing.assert_array_equal(ours[:, : ids.shape[1]], ids)
    pad = torch_model.generation_config.pad_token_id
    pad = eos if pad is None else pad  # transformers pads GPT-2 with its EOS
    finished_early = (ours[:, prompt_len:] == eos).any(axis=1)
    assert finished_early.any() and not finished_early.all(), ours.tolist()


@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_beam_search_token_identical(models, model_type):
    """num_beams 4, length_penalty 1.0 and 0.6, early_stopping True, on a ragged batch where
    EOS ends hypotheses at different steps."""
    torch_model, flax_model = models[model_type]
    ids, mask = batch_for(model_type, flax_model)
    eos = reachable_eos(torch_model, ids, mask, 1)
    for length_penalty in (1.0, 0.6):
        kwargs = dict(
            max_new_tokens=NEW, num_beams=4, length_penalty=length_penalty,
            early_stopping=True, eos_token_id=eos, num_return_sequences=2,
        )  # fmt: skip
        with jax.enable_x64(True):
            ours = flax_model.generate(ids, mask, **kwargs)
        theirs = hf_generate(torch_model, ids, mask, **kwargs)
        assert_same(ours, theirs)
