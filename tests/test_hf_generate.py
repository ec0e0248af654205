"""HFModel.generate against transformers' own generate: token-identical, both sides float64
(random models have near-ties that float32 rounding can flip), tiny random models saved with
save_pretrained. EOS is made reachable by choosing as EOS a token the model does produce, so
rows finish at different steps and the pad fill is exercised."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from flax_transformer.decoding import top_k as top_k_chunks
from tests.hf_models import build, ragged_batch, save

NEW = 10  # new tokens per generate call
PAD, EOS = 63, 0  # Marian's in tests/hf_models.py
WIDE_VOCAB = 4096  # 4 beams x 4096 candidates: 64 chunks, decoding.top_k's chunked path
OPUS_MT_SETTINGS = dict(
    bad_words_ids=[[PAD]], decoder_start_token_id=PAD, eos_token_id=EOS,
    forced_eos_token_id=EOS, max_length=NEW + 1, num_beams=4, pad_token_id=PAD,
)  # fmt: skip


class Models(dict):
    """{name: (transformers model in float64, HFModel in float64)}, built on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name):
        from flax_transformer import hf

        model_type = "marian" if name.startswith("opus") else name
        # Weights larger than transformers' init: the outputs depend on the input.
        init = {"initializer_range" if model_type == "gpt2" else "init_std": 0.5}
        if name == "opus_wide":  # beam search's candidates K x V long enough for chunks
            init["vocab_size"] = WIDE_VOCAB
        torch_model = build(model_type, seed=1, **init)
        if name.startswith("opus"):  # opus-mt's generation_config.json
            torch_model.generation_config.update(**OPUS_MT_SETTINGS)
        path = save(torch_model, self.tmp_path_factory.mktemp(name))
        with jax.enable_x64(True):
            self[name] = (torch_model.double(), hf.load(path, dtype="float64"))
        return self[name]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory)


def batch_for(name: str, flax_model, seed: int = 0):
    """A ragged batch: right-padded sources for seq2seq, left-padded prompts for GPT-2."""
    rng = np.random.default_rng(seed)
    cfg = flax_model.config
    if name == "gpt2":
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


@pytest.mark.parametrize(
    "model_type",
    [
        pytest.param("marian", marks=pytest.mark.slow),
        pytest.param("bart", marks=pytest.mark.slow),
        "gpt2",
    ],
)
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


@pytest.mark.parametrize(
    "name",
    [  # opus_wide and bart in the slow pass (the fast suite is at its 8-minute budget)
        "opus",
        pytest.param("opus_wide", marks=pytest.mark.slow),
        pytest.param("bart", marks=pytest.mark.slow),
    ],
)
def test_beam_search_token_identical(models, name):
    """num_beams 4, length_penalty 1.0 and 0.6, early_stopping True, on a ragged batch where
    EOS ends hypotheses at different steps. "opus": a Marian model with opus-mt's
    generation_config.json, whose max_length, num_beams, bad_words_ids [[pad]] and
    forced_eos_token_id rule where the call says nothing; "opus_wide": the same with a
    4096-token vocabulary, so the candidates are chosen through decoding.top_k's chunks."""
    if name == "opus_wide":
        assert 4 * WIDE_VOCAB // top_k_chunks.CHUNK >= 4 * 8  # the chunked path, not lax.top_k
    torch_model, flax_model = models[name]
    ids, mask = batch_for(name, flax_model)
    eos = reachable_eos(torch_model, ids, mask, 1, num_beams=1)
    for length_penalty in (1.0, 0.6):
        kwargs = dict(
            length_penalty=length_penalty, early_stopping=True, eos_token_id=eos,
            num_return_sequences=2,
        )  # fmt: skip
        if name == "bart":
            kwargs.update(max_new_tokens=NEW, num_beams=4)
        with jax.enable_x64(True):
            ours = flax_model.generate(ids, mask, **kwargs)
        theirs = hf_generate(torch_model, ids, mask, **kwargs)
        assert_same(ours, theirs)
        assert ours.shape[0] == 2 * len(ids)
    if name == "opus":  # max_length 11, pad banned, forced EOS at the last step
        assert ours.shape[1] <= NEW + 1
        assert not (ours[:, 1:] == PAD).all(axis=1).any()
        assert ((ours == EOS) | (ours == eos)).any(axis=1).all()


@pytest.mark.slow
def test_opus_mt_defaults_without_arguments(models):
    """A call without any argument: opus-mt's generation_config.json decides everything."""
    torch_model, flax_model = models["opus"]
    ids, mask = batch_for("marian", flax_model, seed=3)
    with jax.enable_x64(True):
        assert flax_model.generation_config["num_beams"] == 4
        ours = flax_model.generate(ids, mask)
    assert_same(ours, hf_generate(torch_model, ids, mask))


def test_unsupported_options_are_named_in_one_error(models, tmp_path):
    import json

    from flax_transformer import hf

    _, flax_model = models["marian"]
    ids = np.array([[5, 6, 7]])
    with pytest.raises(ValueError, match=r"typical_p=0\.5.*num_beam_groups=2"):
        flax_model.generate(ids, typical_p=0.5, num_beam_groups=2)
    with pytest.raises(ValueError, match="frobnicate=1"):
        flax_model.generate(ids, frobnicate=1)
    torch_model = build("marian", seed=2)
    torch_model.generation_config.update(diversity_penalty=0.5, num_beam_groups=2)
    path = save(torch_model, tmp_path / "groups")
    config = json.loads((path / "generation_config.json").read_text())
    assert config["num_beam_groups"] == 2
    with pytest.raises(ValueError, match=r"num_beam_groups=2 \(generation_config.json\)"):
        hf.load(path).generate(ids)


def test_bad_generate_arguments(models):
    _, marian = models["marian"]
    _, gpt2 = models["gpt2"]
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match="left-padded"):
        gpt2.generate(ids, np.array([[1, 1, 1], [1, 1, 0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"num_return_sequences \(5\) must be <= num_beams"):
        marian.generate(ids, num_beams=4, num_return_sequences=5)
    with pytest.raises(ValueError, match="greedy search"):
        marian.generate(ids, num_return_sequences=2)
    with pytest.raises(ValueError, match="input length of input_ids is 3, but max_length is 3"):
        gpt2.generate(ids, max_length=3)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        marian.generate(ids, np.ones((2, 4), int))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        marian.generate(ids + 1000)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        marian.generate(ids, max_new_tokens=0)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["marian", "gpt2"])  # bart: as marian, a seq2seq
def test_processors_token_identical(models, model_type):
    """repetition_penalty, no_repeat_ngram_size, a two-token bad word and min_new_tokens, in
    greedy and beam search (GPT-2: left-padded, so the processors see the padding too)."""
    torch_model, flax_model = models[model_type]
    ids, mask = batch_for(model_type, flax_model, seed=5)
    prompt_len = ids.shape[1] if model_type == "gpt2" else 1
    eos = reachable_eos(torch_model, ids, mask, prompt_len)
    common = dict(max_new_tokens=NEW, eos_token_id=eos, min_new_tokens=2)
    for kwargs in (
        dict(repetition_penalty=1.7),
        dict(no_repeat_ngram_size=2, bad_words_ids=[[7, 9], [11]]),
        dict(num_beams=3, repetition_penalty=0.8, no_repeat_ngram_size=3),
    ):
        with jax.enable_x64(True):
            ours = flax_model.generate(ids, mask, **common, **kwargs)
        assert_same(ours, hf_generate(torch_model, ids, mask, **common, **kwargs))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["bart", "gpt2"])  # marian: see the opus beam test
def test_beam_search_early_stopping_variants(models, model_type):
    """early_stopping False and "never" (each with its own heuristic) and True, negative and
    positive length penalties; GPT-2 with its ragged left-padded prompts."""
    torch_model, flax_model = models[model_type]
    ids, mask = batch_for(model_type, flax_model, seed=7)
    prompt_len = ids.shape[1] if model_type == "gpt2" else 1
    eos = reachable_eos(torch_model, ids, mask, prompt_len)
    for early_stopping in (False, "never", True):
        for length_penalty in (-0.5, 2.0):
            kwargs = dict(
                max_new_tokens=NEW, num_beams=4, eos_token_id=eos, num_return_sequences=4,
                early_stopping=early_stopping, length_penalty=length_penalty,
            )  # fmt: skip
            with jax.enable_x64(True):
                ours = flax_model.generate(ids, mask, **kwargs)
            assert_same(ours, hf_generate(torch_model, ids, mask, **kwargs))


@pytest.mark.slow
def test_sampling(models):
    """Sampling with top_k=1 is greedy; a seed fixes the draws; other seeds give others;
    num_return_sequences rows per input."""
    torch_model, flax_model = models["gpt2"]
    ids, mask = batch_for("gpt2", flax_model, seed=2)
    with jax.enable_x64(True):
        greedy = flax_model.generate(ids, mask, max_new_tokens=NEW)
        top1 = flax_model.generate(ids, mask, max_new_tokens=NEW, do_sample=True, top_k=1)
        hot = dict(max_new_tokens=NEW, do_sample=True, temperature=3.0, top_p=0.95)
        draws = [flax_model.generate(ids, mask, seed=s, **hot) for s in (0, 0, 1)]
        many = flax_model.generate(ids, mask, num_return_sequences=3, **hot)
    assert_same(top1, greedy)
    assert_same(greedy, hf_generate(torch_model, ids, mask, max_new_tokens=NEW))
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])
    assert many.shape[0] == 3 * len(ids)
    np.testing.assert_array_equal(many[::3, : ids.shape[1]], ids)


@pytest.mark.slow
def test_single_row_greedy(models):
    """One input row (its tied output projection takes the matrix-vector path, nn/model.py)
    gives transformers' tokens, and the same tokens as inside a batch."""
    torch_model, flax_model = models["marian"]
    ids, mask = batch_for("marian", flax_model, seed=4)
    with jax.enable_x64(True):
        alone = flax_model.generate(ids[:1, :9], mask[:1, :9], max_new_tokens=NEW)
        batched = flax_model.generate(ids, mask, max_new_tokens=NEW)
    assert_same(alone, hf_generate(torch_model, ids[:1, :9], mask[:1, :9], max_new_tokens=NEW))
    np.testing.assert_array_equal(alone[0], batched[0, : alone.shape[1]])
