"""The loss of LM batches streamed from the token cache (--lm-text, --train-jsonl) on a model
whose pad_id is its eos_id (Llama and Qwen checkpoints name no pad token): every target inside
its example counts, the EOS too, in every batching mode (bucketed, token budgets, packed), as
the in-memory fine-tuning path counts it and as a hand computation counts it (float64,
1e-12). Before, the cache's batches carried no weights and `target != pad_id` dropped every
EOS target from the loss."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flax_transformer.data import corpus, token_cache
from flax_transformer.data.finetune import read_finetune_dataset
from flax_transformer.data.pipeline import BatchLoader
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.training.steps import batch_loss

MAX_LEN = 16
DOCS = [
    "the cat sat",
    "on the mat and then it slept for a long while in the sun",  # windows of max_len
    "hi",
    "machine learning is fun",
    "a",
    "the end of the book, at last",
]


class NoPadBytes(ByteTokenizer):
    """The byte tokenizer as a Llama checkpoint's: no pad token, padding is the EOS id."""

    pad_id = ByteTokenizer.eos_id


MODES = {
    "bucketed": dict(batch_size=2),
    "token budget": dict(batch_size=2, batch_tokens=48),
    "packed": dict(batch_size=2, pack=True),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(the cached data set, the in-memory fine-tuning data set) of one text file."""
    tmp = tmp_path_factory.mktemp("weights")
    path = tmp / "book.txt"
    path.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    tok = NoPadBytes()
    key = token_cache.cache_key(
        path, "text", LM, token_cache.tokenizer_fingerprint(tok), MAX_LEN, "skip"
    )
    out = tmp / "cache"
    out.mkdir()
    token_cache.build_cache(out, corpus.scan_corpus(path, "text", LM), tok, key)
    return token_cache.CachedDataset(out), read_finetune_dataset(path, tok, MAX_LEN, fmt="text")


def loss_sums(table, batch, pad_id: int) -> tuple[float, float]:
    """(loss_sum, token_count) of training/steps.batch_loss on `batch` with a stand-in model:
    the logits at a position are `table`'s row of the token read there (each example alone in
    its row, packed or not). The batch is first padded to one shape (8, MAX_LEN) with weight
    0, so that the float64 ops compile once for all the batch shapes."""
    rows, length = batch["tgt_in"].shape
    wide = {name: np.full((8, MAX_LEN), pad_id, np.int32) for name in ("tgt_in", "tgt_out")}
    if "tgt_weights" in batch:
        wide["tgt_weights"] = np.zeros((8, MAX_LEN), np.float32)
    for name, array in wide.items():
        array[:rows, :length] = batch[name]
    _, aux = batch_loss(table[wide["tgt_in"]], wide, pad_id)
    return float(aux["loss_sum"]), float(aux["token_count"])


def test_the_cache_weighs_every_target_of_its_rows(data):
    cached, memory = data
    assert len(cached.tgt_weights) == len(cached) == len(memory)
    for index in range(len(cached)):
        weights = cached.tgt_weights[index]
        assert weights.dtype == np.float32
        np.testing.assert_array_equal(weights, memory.tgt_weights[index])
        assert weights.tolist() == [1.0] * len(cached.tgt_out[index])


@pytest.mark.parametrize("mode", MODES)
def test_streamed_loss_counts_the_eos_targets_when_pad_is_eos(data, mode):
    cached, memory = data
    pad = eos = NoPadBytes.eos_id
    rng = np.random.default_rng(0)
    table = rng.normal(size=(NoPadBytes.vocab_size, NoPadBytes.vocab_size)) * 3  # float64
    # By hand: every target of every example, its EOS included.
    nll_sum, count, eos_targets = 0.0, 0, 0
    for tgt_in, tgt_out in zip(memory.tgt_in, memory.tgt_out, strict=True):
        logits = table[tgt_in]
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll_sum -= log_probs[np.arange(len(tgt_out)), tgt_out].sum()
        count += len(tgt_out)
        eos_targets += int((tgt_out == eos).sum())
    assert eos_targets == len(DOCS)  # one a document (its last window)
    streamed = BatchLoader(cached, max_len=MAX_LEN, seed=1, pad_id=pad, **MODES[mode])
    in_memory = BatchLoader(memory, max_len=MAX_LEN, seed=1, pad_id=pad, **MODES[mode])
    count_batches = len(streamed._epoch_plan())
    assert count_batches > 1
    ours = [next(streamed) for _ in range(count_batches)]  # one epoch: every example once
    theirs = [next(in_memory) for _ in range(count_batches)]
    assert streamed.state() == in_memory.state() == {"epoch": 0, "index": count_batches}
    with jax.enable_x64(True):
        sums = [loss_sums(table, batch, pad) for batch in ours]
        # The streamed epoch's loss is the hand computation's: the EOS targets count.
        loss_sum, token_count = (sum(column) for column in zip(*sums, strict=True))
        assert token_count == count
        assert abs(loss_sum / token_count - nll_sum / count) <= 1e-12 * abs(nll_sum / count)
        # ... and its batches and losses are the in-memory fine-tuning path's.
        for batch, same, batch_sums in zip(ours, theirs, sums, strict=True):
            assert batch.keys() == same.keys() and "tgt_weights" in batch
            for name in batch:
                np.testing.assert_array_equal(batch[name], same[name], err_msg=name)
            assert loss_sums(table, same, pad) == batch_sums
    # What `target != pad_id` would have counted: every target but the EOS ones.
    assert sum(int((batch["tgt_out"] != pad).sum()) for batch in ours) == count - eos_targets


def test_a_seq2seq_cache_carries_no_weights(tmp_path):
    """Seq2seq examples keep the `target != pad_id` rule, as encode_pairs' do."""
    path = tmp_path / "pairs.tsv"
    path.write_text("a b\tA B\nc\tC\n", encoding="utf-8")
    tok = ByteTokenizer()
    key = token_cache.cache_key(
        path, "tsv", SEQ2SEQ, token_cache.tokenizer_fingerprint(tok), MAX_LEN, "skip"
    )
    out = tmp_path / "cache"
    out.mkdir()
    token_cache.build_cache(out, corpus.scan_corpus(path, "tsv", SEQ2SEQ), tok, key)
    cached = token_cache.CachedDataset(out)
    assert cached.tgt_weights is None
    assert "tgt_weights" not in next(BatchLoader(cached, 2, MAX_LEN, seed=0))
