"""Tasks, corpus reading (with the errors a user sees), encoding and the bucketing loader."""

import numpy as np
import pytest

from flax_transformer.data.pipeline import (
    BatchLoader,
    DataError,
    bucket_boundaries,
    encode_documents,
    encode_pairs,
    eval_batches,
    generate_task,
    held_out,
    read_text_lines,
    read_tsv,
)
from flax_transformer.data.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_tasks_are_deterministic_and_correct():
    for task, check in (
        ("copy", lambda s, t: s == t),
        ("reverse", lambda s, t: s[::-1] == t),
        ("sort", lambda s, t: "".join(sorted(s)) == t),
    ):
        pairs = generate_task(task, 50, seed=3, min_len=2, max_len=9)
        assert pairs == generate_task(task, 50, seed=3, min_len=2, max_len=9)
        assert all(check(p.source, p.target) and 2 <= len(p.source) <= 9 for p in pairs)
    with pytest.raises(DataError, match="unknown task"):
        generate_task("rotate", 5, 0, 1, 3)
    with pytest.raises(DataError, match="min_len"):
        generate_task("copy", 5, 0, 4, 3)


def test_held_out_set_shares_no_source_with_training():
    train = generate_task("reverse", 300, seed=0, min_len=1, max_len=3)
    valid = held_out(generate_task("reverse", 300, seed=1, min_len=1, max_len=3), train)
    sources = [p.source for p in valid]
    assert valid and len(sources) == len(set(sources))
    assert not set(sources) & {p.source for p in train}


def test_read_tsv_and_its_errors(tmp_path):
    good = tmp_path / "good.tsv"
    good.write_text("hello\tbonjour\r\n\ncat\tchat\n", encoding="utf-8")
    pairs = read_tsv(good)
    assert [(p.source, p.target) for p in pairs] == [("hello", "bonjour"), ("cat", "chat")]
    assert pairs[1].where.endswith("good.tsv:3")

    no_tab = tmp_path / "no_tab.tsv"
    no_tab.write_text("a\tb\nno tab here\n")
    with pytest.raises(DataError, match=r"no_tab.tsv line 2: no tab"):
        read_tsv(no_tab)
    two_tabs = tmp_path / "two.tsv"
    two_tabs.write_text("a\tb\tc\n")
    with pytest.raises(DataError, match=r"line 1: 2 tabs"):
        read_tsv(two_tabs)
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n \n")
    with pytest.raises(DataError, match="empty.tsv: the file is empty"):
        read_tsv(empty)
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes("ok\tfine\nfa\xe7ade\tx\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.tsv line 2: not valid UTF-8 \(byte 0xe7"):
        read_tsv(latin1)
    empty_side = tmp_path / "side.tsv"
    empty_side.write_text("a\t\n")
    with pytest.raises(DataError, match="line 1: empty target"):
        read_tsv(empty_side)
    with pytest.raises(DataError, match="cannot read"):
        read_tsv(tmp_path / "missing.tsv")


def test_encode_pairs_follows_the_sequence_conventions():
    pairs = generate_task("reverse", 3, seed=0, min_len=3, max_len=3)
    data = encode_pairs(pairs, TOK, max_len=16)
    assert data.kind == "seq2seq"
    for i, pair in enumerate(pairs):
        np.testing.assert_array_equal(data.src[i], TOK.encode(pair.source) + [2])
        np.testing.assert_array_equal(data.tgt_in[i], [1] + TOK.encode(pair.target))
        np.testing.assert_array_equal(data.tgt_out[i], TOK.encode(pair.target) + [2])


def test_long_pairs_are_skipped_truncated_or_rejected(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("short\tok\n" + "x" * 20 + "\ty\n")
    pairs = read_tsv(path)
    with pytest.warns(
        UserWarning, match=r"1 pair\(s\) longer than max_len 8 were skipped.*c.tsv:2"
    ):
        skipped = encode_pairs(pairs, TOK, max_len=8, on_long="skip")
    assert len(skipped) == 1
    with pytest.warns(UserWarning, match="truncated"):
        truncated = encode_pairs(pairs, TOK, max_len=8, on_long="truncate")
    assert len(truncated) == 2 and len(truncated.src[1]) == 8 and truncated.src[1][-1] == 2
    with pytest.raises(DataError, match=r"c.tsv:2: pair of 20 \+ 1 tokens does not fit max_len 8"):
        encode_pairs(pairs, TOK, max_len=8, on_long="error")
    with pytest.raises(DataError, match="no pair fits"), pytest.warns(UserWarning):
        encode_pairs(pairs[1:], TOK, max_len=8)


def test_lm_documents_are_windowed(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij\n\nxy\n")
    docs = read_text_lines(path)
    data = encode_documents(docs, TOK, max_len=4)
    # "abcdefghij" -> 12 tokens with bos/eos -> 11 predictions -> windows of 4, 4, 3.
    assert [len(t) for t in data.tgt_in] == [4, 4, 3, 3]
    np.testing.assert_array_equal(data.tgt_in[0], [1] + TOK.encode("abc"))
    np.testing.assert_array_equal(data.tgt_out[0], TOK.encode("abcd"))
    np.testing.assert_array_equal(data.tgt_in[1], TOK.encode("defg"))
    np.testing.assert_array_equal(data.tgt_out[2], TOK.encode("ij") + [2])
    assert data.kind == "lm" and data.src is None


def test_bucket_boundaries():
    assert bucket_boundaries(64) == [8, 16, 24, 32, 48, 64]
    assert bucket_boundaries(8) == [8]
    bounds = bucket_boundaries(512)
    assert bounds[-1] == 512 and len(bounds) <= 12 and bounds == sorted(bounds)


def test_loader_is_deterministic_bucketed_and_resumable():
    pairs = generate_task("copy", 70, seed=0, min_len=1, max_len=20)
    data = encode_pairs(pairs, TOK, max_len=32)

    def take(loader, n):
        return [next(loader) for _ in range(n)]

    first = take(BatchLoader(data, 8, 32, seed=5), 25)  # more than one epoch
    again = take(BatchLoader(data, 8, 32, seed=5), 25)
    other = take(BatchLoader(data, 8, 32, seed=6), 25)
    for a, b in zip(first, again, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    assert any(not np.array_equal(a["src"], b["src"]) for a, b in zip(first, other, strict=True))
    for batch in first:
        length = batch["src"].shape[1]
        assert batch["src"].shape == batch["tgt_in"].shape == batch["tgt_out"].shape == (8, length)
        assert length in (8, 16, 24)
        real = (batch["tgt_out"] != 0).sum(axis=1)
        # Every real row fits its bucket and would not fit the next smaller one.
        longest = max((batch["src"] != 0).sum(axis=1).max(), real.max())
        assert longest <= length and (length == 8 or longest > length - 8)

    # Resume: a fresh loader restored to a position yields the same batches from there on.
    loader = BatchLoader(data, 8, 32, seed=5)
    take(loader, 13)
    position = loader.state()
    resumed = BatchLoader(data, 8, 32, seed=5)
    resumed.restore(position)
    for a, b in zip(take(loader, 12), take(resumed, 12), strict=True):
        np.testing.assert_array_equal(a["tgt_out"], b["tgt_out"])


def test_one_epoch_covers_every_example_once():
    data = encode_pairs(generate_task("copy", 37, seed=1, min_len=1, max_len=20), TOK, max_len=32)
    seen = [tuple(i) for indices, _ in eval_batches(data, 8, 32) for i in [indices.tolist()]]
    flat = sorted(i for group in seen for i in group)
    assert flat == list(range(37))
    for indices, batch in eval_batches(data, 8, 32):
        assert batch["src"].shape[0] == 8
        assert (batch["tgt_out"][len(indices) :] == 0).all()  # filler rows carry no tokens
