"""Byte-level and BPE tokenizers: round trips in any language, special ids, save/load."""

import pytest

from flax_transformer.data.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

TEXTS = ["hello world", "Ünïcödé façade", "机器学习很有趣", "emoji 🙂 ok", "tab\tand\nnewline"]


def test_byte_tokenizer_round_trips_any_language():
    tok = ByteTokenizer()
    for text in TEXTS:
        ids = tok.encode(text)
        assert min(ids) >= 3 and max(ids) < tok.vocab_size == 259
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_byte_tokenizer_specials_and_labels():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = [tok.bos_id] + tok.encode("ab") + [tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "ab"
    assert tok.token_strings(ids) == ["<bos>", "a", "b", "<eos>", "<pad>"]
    # A character cut in the middle decodes to the replacement character, not an exception.
    assert tok.decode(tok.encode("机")[:2]) == "\ufffd"


def test_byte_tokenizer_save_load(tmp_path):
    ByteTokenizer().save(tmp_path / "tok.json")
    loaded = load_tokenizer(tmp_path / "tok.json")
    assert isinstance(loaded, ByteTokenizer)
    assert loaded.decode(loaded.encode("机器 abc")) == "机器 abc"


def test_bpe_tokenizer_trains_round_trips_and_saves(tmp_path):
    corpus = ["the cat sat on the mat", "the dog sat on the log", "机器学习 机器翻译"] * 20
    tok = BPETokenizer.train(corpus, vocab_size=300)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size <= 300
    # Subwords: a frequent word becomes fewer tokens than bytes.
    assert len(tok.encode("the cat sat")) < len(b"the cat sat")
    for text in TEXTS + ["unseen wörds 新词"]:  # byte-level BPE has no unknown token
        assert tok.decode(tok.encode(text)) == text
    assert all(i >= 3 for i in tok.encode("the cat"))  # specials never come out of encode
    tok.save(tmp_path / "bpe.json")
    loaded = load_tokenizer(tmp_path / "bpe.json")
    assert isinstance(loaded, BPETokenizer)
    assert loaded.encode("the cat sat") == tok.encode("the cat sat")
    assert loaded.decode([1] + tok.encode("on the mat") + [2, 0]) == "on the mat"


def test_load_tokenizer_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"something": 1}')
    with pytest.raises(ValueError, match="not a tokenizer file"):
        load_tokenizer(tmp_path / "x.json")
    with pytest.raises(ValueError, match="cannot read tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
