"""Search through `generate`: greedy against torch_reference's plain loop, beam search,
sampling, ragged batches, for both kinds of model; the historical wrappers equal `generate`.

Compilations dominate the time: every call below with the same model, strategy class, beam
size and shapes reuses one compiled loop (the sampling numbers and eos_id are traced)."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference
from flax_transformer import TransformerConfig, make_causal_mask
from flax_transformer.decoding import (
    Beam,
    Greedy,
    Sample,
    beam_search,
    generate,
    greedy_decode,
    length_penalty,
    lm_beam_search,
    lm_greedy_decode,
    lm_sample_decode,
    sample_decode,
)
from flax_transformer.decoding import cache as decoding_cache
from flax_transformer.decoding.cache import CachedState, growing_lengths
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.presets import preset

BOS, PAD = 1, 0
N_NEW = 10
# The tiny preset (1+1 layers): the loops do not depend on depth, and test_decode_cache checks
# the cache of a deeper decoder against full recompute.
CONFIG = preset("tiny", src_vocab_size=31, tgt_vocab_size=29, max_len=24)


def converted(kind: str, seed: int = 0, config: TransformerConfig = CONFIG):
    """A torch_reference model and the Flax model + params holding its weights."""
    torch.manual_seed(seed)
    twin = torch_reference.Transformer if kind == "seq2seq" else torch_reference.TransformerLM
    torch_model = twin(config).eval()
    params = torch_state_to_flax(torch_reference.state_dict_to_numpy(torch_model), config, kind)
    model = model_for(config, kind)
    return torch_model, model, params


@torch.no_grad()
def torch_greedy(step_logits, prompt: list[int], steps: int, eos_id: int) -> list[int]:
    """The plain loop: re-run the whole prefix for every token, stop at EOS, pad the rest."""
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(step_logits(torch.tensor([tokens]))[0, -1].argmax()))
        if tokens[-1] == eos_id:
            break
    new = tokens[len(prompt) :]
    return new + [PAD] * (steps - len(new))


def pick_eos(rows: list[list[int]]) -> int:
    """A token the free-running decoder emits mid-sequence, used as EOS to exercise stopping."""
    return int(rows[0][3])


@pytest.fixture(scope="module")
def seq2seq():
    torch_model, model, params = converted("seq2seq")
    src = np.random.default_rng(0).integers(3, CONFIG.src_vocab_size, (4, 9))
    src[1, 4:] = PAD  # ragged sources
    src[3, 6:] = PAD

    def reference(eos_id):
        rows = []
        for example in src:
            real = torch.tensor(example[example != PAD][None])
            step = lambda t, real=real: torch_model(real, t)  # noqa: E731
            rows.append(torch_greedy(step, [BOS], N_NEW, eos_id))
        return np.array(rows)

    eos = pick_eos(reference(eos_id=-1).tolist())
    return model, params, src, eos, reference(eos)


@pytest.fixture(scope="module")
def lm():
    torch_model, model, params = converted("lm", seed=1)
    lengths = [4, 3, 6]  # ragged prompts, each starts with BOS: a 3-token prefill, then forced
    prompts = np.random.default_rng(1).integers(3, CONFIG.tgt_vocab_size, (3, 6))
    prompts[:, 0] = BOS
    for row, n in enumerate(lengths):
        prompts[row, n:] = PAD

    def reference(eos_id):
        rows = []
        for example, n in zip(prompts, lengths, strict=True):
            rows.append(torch_greedy(torch_model, example[:n].tolist(), N_NEW, eos_id))
        return np.array(rows)

    eos = pick_eos(reference(eos_id=-1).tolist())
    return model, params, prompts, eos, reference(eos)


# ----------------------------------------------------------------------------------- greedy


def test_seq2seq_greedy_equals_torch_plain_loop_cached_and_uncached(seq2seq):
    model, params, src, eos, expected = seq2seq
    assert (expected == eos).any() and (expected == PAD).any()  # EOS and padding exercised
    for use_cache in (True, False):
        tokens = generate(
            model, params, src, Greedy(), max_new_tokens=N_NEW, bos_id=BOS, eos_id=eos,
            use_cache=use_cache,
        )  # fmt: skip
        assert tokens.shape == (4, N_NEW) and tokens.dtype == jnp.int32
        np.testing.assert_array_equal(tokens, expected, err_msg=f"use_cache={use_cache}")


def test_lm_greedy_ragged_prompts_equal_each_prompt_alone(lm):
    model, params, prompts, eos, expected = lm
    assert (expected == eos).any()
    for use_cache in (True, False):
        tokens = generate(
            model, params, prompts, Greedy(), max_new_tokens=N_NEW, eos_id=eos, use_cache=use_cache
        )
        np.testing.assert_array_equal(tokens, expected, err_msg=f"use_cache={use_cache}")


def test_several_eos_ids_end_a_row_at_the_first_of_them(lm):
    """eos_id as a sequence (a chat model's end-of-turn and end-of-text): greedy rows are the
    torch loop's rows (cut after eos) cut after the first of them."""
    model, params, prompts, eos, reference = lm
    row = next(r for r, tokens in enumerate(reference) if eos not in tokens[:2])
    other = int(reference[row, 1])  # a token that row chooses early, made an end id too
    ends = (eos, other)
    tokens = np.asarray(
        generate(model, params, prompts, Greedy(), max_new_tokens=N_NEW, eos_id=ends)
    )
    for free, out in zip(reference, tokens, strict=True):
        first = next((i for i, t in enumerate(free) if t in ends), None)
        expected = free.copy()
        if first is not None:
            expected[first + 1 :] = PAD
        np.testing.assert_array_equal(out, expected)
    assert (tokens[row, 2:] == PAD).all() and (reference[row, 2:] != PAD).any()  # `other` ended it


@pytest.mark.slow  # two beam searches compiled
def test_several_eos_ids_in_beam_search(lm):
    model, params, prompts, eos, reference = lm
    row = next(r for r, tokens in enumerate(reference) if eos not in tokens[:2])
    other = int(reference[row, 1])
    ends = (eos, other)
    beam = functools.partial(generate, model, params, prompts, Beam(3, 0.6), max_new_tokens=N_NEW)
    one = beam(eos_id=eos)
    for a, b in zip(one, beam(eos_id=[eos]), strict=True):  # one id as a list: the same search
        np.testing.assert_array_equal(a, b)
    seqs, _ = beam(eos_id=ends)
    finished = 0
    for seq in np.asarray(seqs).reshape(-1, N_NEW):
        first = next((i for i, t in enumerate(seq) if t in ends), None)
        if first is not None:
            finished += 1
            assert (seq[first + 1 :] == PAD).all()
    assert finished > 0 and (np.asarray(seqs) == other).any()


# ------------------------------------------------------------------------------ beam search


def test_beam_one_equals_greedy(seq2seq, lm):
    model, params, src, eos, expected = seq2seq
    tokens, scores = generate(
        model, params, src, Beam(1, alpha=0.0), max_new_tokens=N_NEW, bos_id=BOS, eos_id=eos
    )
    assert tokens.shape == (4, 1, N_NEW) and scores.shape == (4, 1)
    np.testing.assert_array_equal(tokens[:, 0], expected)
    model, params, prompts, eos, expected = lm
    tokens, _ = generate(
        model, params, prompts, Beam(1, alpha=0.0), max_new_tokens=N_NEW, eos_id=eos
    )
    np.testing.assert_array_equal(tokens[:, 0], expected)


def test_growing_lengths():
    assert growing_lengths(1, 64) == (32, 64)
    assert growing_lengths(1, 511) == (32, 64, 128, 256, 511)
    assert growing_lengths(100, 511) == (128, 256, 511)
    assert growing_lengths(1, 20) == (20,)
    assert growing_lengths(32, 40) == (40,)  # the first length holds the prefix and one more


# A long cell (the fast suite is at its 8-minute budget): the slow pass (`pytest -m slow`, CI).
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_a_growing_cache_decodes_as_one_of_full_length(kind, request, monkeypatch):
    """Caches that grow 4 -> 8 -> 10 (seq2seq) or 4 -> 8 -> 15 (the LM, its 3-token prefill):
    greedy gives torch's tokens, beam search the tokens and scores of one full-length cache."""
    model, params, inputs, eos, expected = request.getfixturevalue(kind)
    bos = {"bos_id": BOS} if kind == "seq2seq" else {}
    grown = []
    real_grown = CachedState.grown
    monkeypatch.setattr(
        CachedState, "grown", lambda self, n: grown.append(n) or real_grown(self, n)
    )

    def decode(first_len, strategy):
        monkeypatch.setattr(decoding_cache, "FIRST_CACHE_LEN", first_len)
        jax.clear_caches()  # (the lengths are read when generate is traced)
        return generate(model, params, inputs, strategy, max_new_tokens=N_NEW, eos_id=eos, **bos)

    np.testing.assert_array_equal(decode(4, Greedy()), expected)
    tokens, scores = decode(64, Beam(3, alpha=0.6))
    grown_tokens, grown_scores = decode(4, Beam(3, alpha=0.6))
    np.testing.assert_array_equal(grown_tokens, tokens)
    np.testing.assert_allclose(grown_scores, scores, rtol=1e-6)
    full = 10 if kind == "seq2seq" else 15
    assert grown == [8, full, 8, full]  # both growing runs grew


@functools.partial(jax.jit, static_argnames="model")
def lm_logits(model, params, tokens):
    """Full-forward logits; causal mask only (a generated pad id is a token like any other)."""
    return model.apply(params, tokens, mask=make_causal_mask(tokens.shape[1]))


@functools.partial(jax.jit, static_argnames="model")
def seq2seq_logits(model, params, src, tgt_in):
    causal = make_causal_mask(tgt_in.shape[1])  # a generated pad id is a token like any other
    return model.apply(params, src, tgt_in, tgt_mask=causal)


def sequence_log_prob(model, params, src, new_tokens, eos_id) -> np.ndarray:
    """Sum of log p(token) over each row's tokens up to its first EOS, by one full forward."""
    tgt = np.concatenate([np.full((len(new_tokens), 1), BOS), new_tokens], axis=1)
    logp = jax.nn.log_softmax(seq2seq_logits(model, params, src, tgt[:, :-1]), axis=-1)
    picked = np.take_along_axis(np.asarray(logp), tgt[:, 1:, None], axis=-1)[..., 0]
    keep = np.cumsum(np.cumsum(new_tokens == eos_id, axis=1), axis=1) <= 1  # up to first EOS
    return (picked * keep).sum(axis=1), keep.sum(axis=1)


@pytest.mark.slow
def test_exhaustive_beam_finds_the_best_scored_sequence():
    """Vocab 6, 3 new tokens: a beam of 36 holds every prefix, so it must return the best of
    all 6 + 6^2 + 6^3 candidate outputs under the length-penalised score."""
    config = CONFIG.replace(tgt_vocab_size=6, max_len=8, num_decoder_layers=1)
    _, model, params = converted("seq2seq", seed=3, config=config)
    src = np.array([[5, 9, 4, 7, 0, 0], [12, 3, 3, 8, 30, 2]])
    eos, alpha, steps = 2, 0.6, 3
    tokens, scores = generate(
        model, params, src, Beam(36, alpha), max_new_tokens=steps, bos_id=BOS, eos_id=eos
    )
    # Every output: ends in EOS at length 1..3, or reaches length 3 without one.
    outputs = [
        list(p) + [eos] + [PAD] * (steps - 1 - len(p))
        for n in range(steps)
        for p in itertools.product(range(6), repeat=n)
        if eos not in p
    ] + [list(p) for p in itertools.product(range(6), repeat=steps) if eos not in p]
    outputs = np.array(outputs)
    index = {tuple(o): i for i, o in enumerate(outputs.tolist())}
    # Both sources in one forward (one compilation): (2 * len(outputs), ...).
    logp, lengths = sequence_log_prob(
        model, params, np.repeat(src, len(outputs), 0), np.tile(outputs, (2, 1)), eos
    )
    brute_all = (logp / np.asarray(length_penalty(lengths, alpha))).reshape(2, len(outputs))
    for row in range(len(src)):
        brute = brute_all[row]
        best = int(np.argmax(brute))
        np.testing.assert_array_equal(tokens[row, 0], outputs[best])
        np.testing.assert_allclose(scores[row, 0], brute[best], rtol=1e-5)
        # The other beams are real, distinct candidates with their true scores, best first.
        assert np.all(np.diff(np.asarray(scores[row])) <= 1e-6)
        chosen = [index[tuple(t)] for t in np.asarray(tokens[row, :5]).tolist()]
        assert len(set(chosen)) == 5
        np.testing.assert_allclose(scores[row, :5], brute[chosen], rtol=1e-5)


def continuation_logits(model, params, prompts, lengths, new_tokens):
    """Logits (R, N, V) predicting each of new_tokens (R, N) after its prompt, by one full
    forward over every row at once (trailing pads are hidden by the causal mask)."""
    width = prompts.shape[1] + new_tokens.shape[1]
    full = np.zeros((len(new_tokens), width), np.int32)
    for row, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        full[row, : n + new_tokens.shape[1]] = np.concatenate([prompt[:n], new_tokens[row]])
    logits = np.asarray(lm_logits(model, params, full))
    return np.stack([logits[r, n - 1 : n - 1 + new_tokens.shape[1]] for r, n in enumerate(lengths)])


def new_count(row: np.ndarray, eos_id: int) -> int:
    """How many tokens a row really produced: up to and including its first EOS."""
    return int(np.argmax(row == eos_id)) + 1 if (row == eos_id).any() else len(row)


def test_lm_beam_search_ragged_scores_are_true_log_probs(lm):
    model, params, prompts, eos, _ = lm
    beams = 3
    tokens, scores = generate(
        model, params, prompts, Beam(beams, alpha=0.6), max_new_tokens=N_NEW, eos_id=eos
    )
    tokens = np.asarray(tokens).reshape(-1, N_NEW)  # (B * beams, N)
    lengths = np.repeat((prompts != PAD).sum(1), beams)
    logp = jax.nn.log_softmax(
        continuation_logits(model, params, np.repeat(prompts, beams, 0), lengths, tokens)
    )
    picked = np.take_along_axis(np.asarray(logp), tokens[..., None], axis=-1)[..., 0]
    for row, new in enumerate(tokens):
        count = new_count(new, eos)
        true_score = picked[row, :count].sum() / float(length_penalty(count, 0.6))
        np.testing.assert_allclose(scores.reshape(-1)[row], true_score, rtol=1e-5)
        assert np.all(new[count:] == PAD)
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6)  # best first
    uncached, uncached_scores = generate(
        model, params, prompts, Beam(beams, alpha=0.6), max_new_tokens=N_NEW, eos_id=eos,
        use_cache=False,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(uncached).reshape(-1, N_NEW), tokens)
    np.testing.assert_allclose(uncached_scores, scores, rtol=1e-5)


# --------------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_and_key_dependent(seq2seq):
    model, params, src, eos, _ = seq2seq
    kwargs = dict(max_new_tokens=N_NEW, bos_id=BOS, eos_id=eos)
    first = generate(model, params, src, Sample(temperature=2.0), rng=jax.random.key(7), **kwargs)
    again = generate(model, params, src, Sample(temperature=2.0), rng=jax.random.key(7), **kwargs)
    other = generate(model, params, src, Sample(temperature=2.0), rng=jax.random.key(8), **kwargs)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    for row in np.asarray(first):  # pad after the first EOS, as greedy
        assert np.all(row[new_count(row, eos) :] == PAD)


def test_top_k_one_tiny_top_p_and_zero_temperature_are_greedy(seq2seq, lm):
    model, params, src, eos, expected = seq2seq
    kwargs = dict(max_new_tokens=N_NEW, bos_id=BOS, eos_id=eos, rng=jax.random.key(0))
    for strategy in (Sample(top_k=1), Sample(temperature=0.0)):
        np.testing.assert_array_equal(
            generate(model, params, src, strategy, **kwargs), expected, err_msg=str(strategy)
        )
    model, params, prompts, eos, expected = lm
    tokens = generate(
        model, params, prompts, Sample(temperature=5.0, top_p=1e-6), rng=jax.random.key(0),
        max_new_tokens=N_NEW, eos_id=eos,
    )  # fmt: skip
    np.testing.assert_array_equal(tokens, expected)


@pytest.mark.slow
def test_sampled_tokens_respect_top_k_and_top_p(lm):
    model, params, prompts, _, _ = lm
    eos = CONFIG.tgt_vocab_size - 1
    lengths = (prompts != PAD).sum(1)
    for top_k, top_p in [(3, 1.0), (0, 0.5)]:
        tokens = generate(
            model, params, prompts, Sample(3.0, top_k, top_p), rng=jax.random.key(1),
            max_new_tokens=N_NEW, eos_id=eos,
        )  # fmt: skip
        tokens = np.asarray(tokens)
        probs = np.asarray(
            jax.nn.softmax(continuation_logits(model, params, prompts, lengths, tokens) / 3.0)
        )
        for row, new in enumerate(tokens):
            for step in range(new_count(new, eos)):
                p = probs[row, step]
                more_likely = p > p[new[step]]
                if top_k:
                    assert more_likely.sum() < top_k
                else:  # the mass strictly above the sampled token is below top_p
                    assert p[more_likely].sum() < top_p


# ------------------------------------------------------------------------------- wrappers


# A long cell (the fast suite is at its 8-minute budget): the slow pass (`pytest -m slow`, CI).
@pytest.mark.slow
def test_wrappers_equal_generate(seq2seq, lm):
    """The six historical names are one call of generate each (same compiled loops as above)."""
    model, params, src, eos, _ = seq2seq
    common = dict(max_new_tokens=N_NEW, bos_id=BOS, eos_id=eos)
    key = jax.random.key(7)
    pairs = [
        (greedy_decode(model, params, src, **common), generate(model, params, src, **common)),
        (
            sample_decode(model, params, src, rng=key, temperature=2.0, top_k=4, **common),
            generate(model, params, src, Sample(2.0, top_k=4), rng=key, **common),
        ),
        (
            beam_search(model, params, src, beam_size=1, alpha=0.5, **common),
            generate(model, params, src, Beam(1, alpha=0.5), **common),
        ),
    ]
    model, params, prompts, eos, _ = lm
    common = dict(max_new_tokens=N_NEW, eos_id=eos)
    lengths = (prompts != PAD).sum(1)
    pairs += [
        (
            lm_greedy_decode(model, params, prompts, lengths, **common),
            generate(model, params, prompts, Greedy(), lengths=lengths, **common),
        ),
        (
            lm_sample_decode(model, params, prompts, rng=key, top_p=0.5, **common),
            generate(model, params, prompts, Sample(top_p=0.5), rng=key, **common),
        ),
        (
            lm_beam_search(model, params, prompts, beam_size=3, **common),
            generate(model, params, prompts, Beam(3), **common),
        ),
    ]
    for wrapped, direct in pairs:
        for a, b in zip(jax.tree.leaves(wrapped), jax.tree.leaves(direct), strict=True):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ bad input


def test_bad_arguments_give_clear_errors(seq2seq, lm):
    model, params, src, eos, _ = seq2seq
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, params, src, max_new_tokens=CONFIG.max_len + 1, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, params, src, max_new_tokens=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="src has length"):
        greedy_decode(model, params, np.ones((1, 30), int), max_new_tokens=4, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="boolean key mask"):
        float_mask = np.zeros((4, 1, 1, 9), np.float32)
        greedy_decode(model, params, src, max_new_tokens=4, bos_id=1, eos_id=2, src_mask=float_mask)
    with pytest.raises(ValueError, match="does not broadcast"):
        bad_mask = np.ones((4, 1, 1, 5), bool)
        greedy_decode(model, params, src, max_new_tokens=4, bos_id=1, eos_id=2, src_mask=bad_mask)
    with pytest.raises(ValueError, match="eos_id"):
        greedy_decode(model, params, src, max_new_tokens=4, bos_id=1, eos_id=99)
    with pytest.raises(ValueError, match="needs bos_id"):  # an LM function given a seq2seq model
        lm_greedy_decode(model, params, src, max_new_tokens=4, eos_id=2)
    with pytest.raises(ValueError, match="lengths is for an LM"):
        generate(model, params, src, lengths=[3] * 4, max_new_tokens=4, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="top_p"):
        sample_decode(model, params, src, rng=jax.random.key(0), max_new_tokens=4, bos_id=1,
                      eos_id=2, top_p=0.0)  # fmt: skip
    with pytest.raises(ValueError, match="Sample needs rng"):
        generate(model, params, src, Sample(), max_new_tokens=4, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="Beam size"):
        beam_search(model, params, src, beam_size=0, max_new_tokens=4, bos_id=1, eos_id=2)
    with pytest.raises(TypeError, match="strategy must be"):
        generate(model, params, src, "beam", max_new_tokens=4, bos_id=1, eos_id=2)
    for bad, message in [
        (lambda: Sample(temperature=-1.0), "temperature"),
        (lambda: Sample(top_k=1.5), "top_k"),
        (lambda: Sample(top_p=1.5), "top_p"),
        (lambda: Beam(2, alpha=-0.1), "alpha"),
        (lambda: Beam(True), "Beam size"),
    ]:
        with pytest.raises(ValueError, match=message):
            bad()
    model, params, prompts, eos, _ = lm
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        lm_greedy_decode(model, params, prompts, max_new_tokens=CONFIG.max_len, eos_id=2)
    with pytest.raises(ValueError, match="every prompt needs"):
        lm_greedy_decode(model, params, np.zeros((2, 3), int), max_new_tokens=4, eos_id=2)
    with pytest.raises(ValueError, match="bos_id is for a seq2seq"):  # seq2seq call, LM model
        greedy_decode(model, params, prompts, max_new_tokens=4, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="src_mask is for a seq2seq"):
        generate(model, params, prompts, src_mask=prompts != PAD, max_new_tokens=4, eos_id=2)
