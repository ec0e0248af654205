"""hf.load(path, quantize="int8"): int8 weights and dynamic int8 matrix products
(nn.int8_products), on a tiny Marian trained briefly here to reverse its input (random weights
make near-ties, and near-ties flip under any rounding)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from flax_transformer import hf
from flax_transformer.nn.int8 import Int8Matrix
from tests import hf_models

pytest.importorskip("transformers")


def _train_to_reverse(model, steps: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            ids, mask = _batch(rng, 16)
            labels = np.full((len(ids), ids.shape[1] + 1), -100)
            for row, n in enumerate(mask.sum(1)):
                labels[row, : n + 1] = [*ids[row, :n][::-1], hf_models.MARIAN_EOS]
            loss = model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                labels=torch.from_numpy(labels),
            ).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _batch(rng, rows: int):
    lengths = rng.integers(3, 10, size=rows)
    return hf_models.ragged_batch(
        rng, hf_models.VOCAB - 1, lengths, low=2, pad=hf_models.MARIAN_PAD
    )


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    model = _train_to_reverse(hf_models.build("marian"))
    return hf_models.save(model, tmp_path_factory.mktemp("marian_int8"))


def _tokens_same_share(a: np.ndarray, b: np.ndarray) -> float:
    width = max(a.shape[1], b.shape[1])
    pad = hf_models.MARIAN_PAD
    a = np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=pad)
    b = np.pad(b, ((0, 0), (0, width - b.shape[1])), constant_values=pad)
    real = (a != pad) | (b != pad)
    return float(np.mean((a == b)[real]))


@pytest.mark.parametrize("num_beams", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_int8_generation_agrees_with_float32(marian_dir, num_beams):
    import sacrebleu

    f32 = hf.load(marian_dir)
    q8 = hf.load(marian_dir, quantize="int8")
    ids, mask = _batch(np.random.default_rng(1), 16)
    kwargs = dict(num_beams=num_beams, max_new_tokens=12)
    ours, theirs = q8.generate(ids, mask, **kwargs), f32.generate(ids, mask, **kwargs)
    ended = (theirs == hf_models.MARIAN_EOS).any(axis=1)
    assert ended.mean() > 0.5, theirs.tolist()  # not degenerate: the trained model stops
    same = _tokens_same_share(ours, theirs)
    text = lambda rows: [" ".join(map(str, r[r != hf_models.MARIAN_PAD])) for r in rows]  # noqa: E731
    bleu = sacrebleu.corpus_bleu(text(ours), [text(theirs)]).score
    print(f"num_beams={num_beams}: same tokens {same:.3f}, BLEU vs float32 {bleu:.1f}")
    assert same >= 0.9 and bleu >= 80, (same, bleu)


def test_int8_params_are_int8_and_the_step_has_an_int8_dot(marian_dir):
    q8 = hf.load(marian_dir, quantize="int8")
    is_q = lambda x: isinstance(x, Int8Matrix)  # noqa: E731
    leaves = jax.tree.leaves(q8.variables, is_leaf=is_q)
    quantized = [x for x in leaves if is_q(x)]
    assert quantized and all(x.values.dtype == np.int8 for x in quantized)
    assert all(x.scale.dtype == np.float32 for x in quantized)
    float_matrices = [x for x in leaves if not is_q(x) and np.ndim(x) == 2]
    assert not float_matrices, [x.shape for x in float_matrices]  # every matrix is int8
    ids = np.full((1, 5), 3, np.int32)
    mask = np.ones((1, 1, 1, 5), bool)
    lowered = jax.jit(q8.module.apply).lower(q8.variables, ids, ids, src_mask=mask).as_text()
    dots = [line for line in lowered.splitlines() if "dot_general" in line]
    assert any("xi8>" in line and "xi32>" in line for line in dots), dots[:3]


def test_quantize_none_is_the_float_model_bit_for_bit(marian_dir):
    plain, none = hf.load(marian_dir), hf.load(marian_dir, quantize=None)
    assert type(plain.module) is type(none.module)
    for a, b in zip(jax.tree.leaves(plain.variables), jax.tree.leaves(none.variables), strict=True):
        np.testing.assert_array_equal(a, b)
    ids, mask = _batch(np.random.default_rng(2), 4)
    np.testing.assert_array_equal(
        plain.forward(ids, mask, decoder_input_ids=ids),
        none.forward(ids, mask, decoder_input_ids=ids),
    )


def test_bad_quantize_values_name_the_choices(marian_dir, tmp_path):
    with pytest.raises(ValueError, match=r"quantize must be one of \(None, 'int8'\), got 'int4'"):
        hf.load(marian_dir, quantize="int4")
    with pytest.raises(ValueError, match="computes in float32"):
        hf.load(marian_dir, dtype="bfloat16", quantize="int8")
    with pytest.raises(ValueError, match="writes float weights"):
        hf.save(hf.load(marian_dir, quantize="int8"), tmp_path / "out")
