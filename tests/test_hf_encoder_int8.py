"""hf.load(path, quantize="int8") for encoders (BERT, RoBERTa, DistilBERT, their heads):
dynamic int8 products as for generation (nn.int8_products). Agreement with float32 on a tiny
BERT classifier trained briefly here (random weights make near-ties between labels, which any
rounding flips) and on a bare encoder's embeddings (cosine per token)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from flax_transformer import hf
from flax_transformer.nn.int8 import Int8Matrix
from tests import hf_models

pytest.importorskip("transformers")

VOCAB = hf_models.ENCODER_VOCAB
LOW = (3, VOCAB // 2)  # the task: are most real tokens of a row in this half of the ids?


def _batch(rng, rows: int):
    lengths = rng.integers(4, 13, size=rows)
    ids, mask = hf_models.ragged_batch(rng, VOCAB, lengths, low=3, pad=0)
    low = ((ids >= LOW[0]) & (ids < LOW[1]) & (mask == 1)).sum(1)
    return ids, mask, (2 * low > mask.sum(1)).astype(np.int64)


def _train_classifier(steps: int = 120, seed: int = 0):
    """A tiny BertForSequenceClassification (2 labels) trained on the task above."""
    import transformers

    torch.manual_seed(seed)
    config = hf_models.encoder_only_config("bert")
    config.num_labels, config.id2label, config.label2id = 2, {0: "no", 1: "yes"}, None
    model = transformers.BertForSequenceClassification(config)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            ids, mask, labels = (torch.from_numpy(a) for a in _batch(rng, 32))
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return hf_models.save(_train_classifier(), tmp_path_factory.mktemp("bert_int8"))


def test_int8_classifier_gives_the_float32_labels(classifier_dir):
    f32 = hf.load(classifier_dir)
    q8 = hf.load(classifier_dir, quantize="int8")
    ids, mask, labels = _batch(np.random.default_rng(1), 256)
    ours, theirs = q8.forward(ids, mask), f32.forward(ids, mask)
    accuracy = float(np.mean(theirs.argmax(-1) == labels))
    assert accuracy > 0.8, accuracy  # trained: its labels are not near-ties
    agreement = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    print(f"int8 labels = float32 labels: {agreement:.4f} (float32 accuracy {accuracy:.4f})")
    assert agreement >= 0.98, agreement
    assert not np.array_equal(ours, theirs)  # the int8 products ran


def test_int8_encoder_holds_its_products_in_int8_and_saves_refused(classifier_dir, tmp_path):
    q8 = hf.load(classifier_dir, quantize="int8")
    leaves = jax.tree_util.tree_leaves(q8.variables, is_leaf=lambda x: isinstance(x, Int8Matrix))
    int8 = [leaf for leaf in leaves if isinstance(leaf, Int8Matrix)]
    # per layer query, key, value, out, two feed-forward; the pooler, the classifier, the
    # word and token-type tables
    assert len(int8) == 2 * 6 + 2 + 2
    with pytest.raises(ValueError, match="loaded with quantize='int8'"):
        hf.save(q8, tmp_path / "out")


@pytest.mark.parametrize(
    "name", ["bert", *(pytest.param(n, marks=pytest.mark.slow) for n in ("roberta", "distilbert"))]
)
def test_int8_embeddings_point_where_float32_ones_do(name, tmp_path):
    """The bare encoders' last hidden states: every real token's vector within a small angle
    of float32's; encoder_fn of the int8 model computes the same as its forward."""
    torch_model = hf_models.build_encoder_only(name)
    directory = hf_models.save(torch_model, tmp_path / name)
    f32 = hf.load(directory)
    q8 = hf.load(directory, quantize="int8")
    pad = 0 if name.startswith("bert") else 1
    ids, mask, _ = hf_models.encoder_only_batch(np.random.default_rng(2), pad, types=False)
    ours, theirs = q8.forward(ids, mask), f32.forward(ids, mask)
    real = mask == 1
    a, b = ours[real].astype(np.float64), theirs[real].astype(np.float64)
    cosine = np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    print(f"{name}: cosine to float32 min {cosine.min():.5f}, mean {cosine.mean():.5f}")
    assert cosine.min() > 0.99, cosine.min()
    assert not np.allclose(ours, theirs, atol=1e-5)  # the int8 products ran
    encoded = np.asarray(jax.jit(q8.encoder_fn())(ids, mask))
    np.testing.assert_allclose(encoded[real], ours[real], atol=1e-5)
    with pytest.raises(ValueError, match="computes in float32, not bfloat16"):
        q8.encoder_fn("bfloat16")
