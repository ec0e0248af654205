"""The streaming corpus reader and the on-disk token cache: the same examples and batches as
the in-memory path, the cache reused by --resume (no second tokenization) and rebuilt when the
input changes, JSONL input and its errors, a bounded BPE sample, exact resume from the cache."""

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import train
from flax_transformer.cli.train import split_off_validation
from flax_transformer.data import corpus, token_cache
from flax_transformer.data.pipeline import (
    BatchLoader,
    DataError,
    encode_documents,
    encode_pairs,
    read_text_lines,
    read_tsv,
)
from flax_transformer.data.tokenizer import BPETokenizer, ByteTokenizer
from flax_transformer.interop.convert import load_safetensors
from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.training.hooks import STOP

WORDS = ["chat", "chien", "maison", "arbre", "soleil", "lune", "eau", "feu"]


def write_tsv(path, count, seed=0, long_every=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(count):
        words = rng.choice(WORDS, size=int(rng.integers(1, 4)))
        if long_every and i % long_every == 0:
            words = list(words) * 6  # longer than max_len 24
        lines.append(" ".join(words) + "\t" + " ".join(w.upper() for w in words))
        if i % 7 == 3:
            lines.append("")  # blank lines are skipped
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def build(tmp_path, path, fmt, kind, tokenizer, max_len, on_long="skip", held=(), **kw):
    scan = corpus.scan_corpus(path, fmt, kind)
    sha = token_cache.tokenizer_fingerprint(tokenizer)
    key = token_cache.cache_key(path, fmt, kind, sha, max_len, on_long)
    out = tmp_path / f"cache-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    token_cache.build_cache(out, scan, tokenizer, key, held, **kw)
    return token_cache.CachedDataset(out), key


def assert_same_examples(cached, memory):
    assert len(cached) == len(memory)
    np.testing.assert_array_equal(cached.lengths(), memory.lengths())
    for name in ("src", "tgt_in", "tgt_out"):
        if getattr(memory, name) is None:
            assert getattr(cached, name) is None
            continue
        for a, b in zip(getattr(cached, name), getattr(memory, name), strict=True):
            assert a.dtype == np.int32
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("on_long", ["skip", "truncate"])
def test_cache_holds_the_examples_of_encode_pairs_and_gives_the_same_batches(tmp_path, on_long):
    path = write_tsv(tmp_path / "c.tsv", 200, long_every=17)
    tok = ByteTokenizer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cached, _ = build(tmp_path, path, "tsv", SEQ2SEQ, tok, 24, on_long)
        memory = encode_pairs(read_tsv(path), tok, 24, on_long)
    assert len(caught) == 2 and str(caught[0].message) == str(caught[1].message)
    assert_same_examples(cached, memory)
    assert token_cache.CachedDataset(cached.directory).kind == SEQ2SEQ
    # The loader: the same batches, epoch after epoch, from the same seed.
    a, b = BatchLoader(cached, 8, 24, seed=3), BatchLoader(memory, 8, 24, seed=3)
    for _ in range(3 * (len(memory) // 8 + 1)):
        x, y = next(a), next(b)
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])
    assert a.state() == b.state() and a.epoch >= 2


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_reading_rows_maps_no_cache_file_into_the_process(tmp_path):
    """Rows are read, not memory-mapped: the kernel maps up to 16 neighbouring pages of a file
    map per fault and counts them as the run's resident memory, so random rows of a mapped
    3M-pair cache had added ~290 MB to a 20-step run's peak RSS (bench.data_scale)."""
    cached, _ = build(tmp_path, write_tsv(tmp_path / "c.tsv", 50), "tsv", SEQ2SEQ,
                      ByteTokenizer(), 24)  # fmt: skip
    batch = next(BatchLoader(cached, 8, 24, seed=0))
    assert batch["src"].shape[0] == 8 and cached.lengths().shape == (len(cached),)
    rows = [cached.src[i] for i in range(len(cached))] + [cached.tgt_out[-1]]
    assert all(row.dtype == np.int32 and row.size for row in rows)
    maps = Path("/proc/self/maps").read_text()
    assert str(cached.directory) not in maps


def test_a_cache_file_cut_short_is_a_data_error_naming_it(tmp_path):
    cached, _ = build(tmp_path, write_tsv(tmp_path / "c.tsv", 50), "tsv", SEQ2SEQ,
                      ByteTokenizer(), 24)  # fmt: skip
    tokens = cached.directory / "tgt.tokens"
    tokens.write_bytes(tokens.read_bytes()[:-40])
    cut = token_cache.CachedDataset(cached.directory)
    with pytest.raises(DataError, match=r"tgt\.tokens: the token cache file is shorter"):
        cut.tgt_in[len(cut) - 1]


def test_lm_cache_holds_the_windows_of_encode_documents(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("the cat sat on the mat\n\n机器学习很有趣\nhello world " * 3 + "\n")
    tok = ByteTokenizer()
    cached, _ = build(tmp_path, path, "text", LM, tok, 16)
    assert_same_examples(cached, encode_documents(read_text_lines(path), tok, 16))
    assert cached.kind == LM


def test_the_pool_writes_the_same_cache_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_RECORDS", 64)
    path = write_tsv(tmp_path / "c.tsv", 500)
    texts = (t for line in path.read_text().splitlines() for t in line.split("\t") if t)
    tok = BPETokenizer.train(texts, vocab_size=300)
    held = corpus.held_out_indices(500, seed=1)
    one, _ = build(tmp_path, path, "tsv", SEQ2SEQ, tok, 24, held=held, workers=0)
    two, _ = build(tmp_path, path, "tsv", SEQ2SEQ, tok, 24, held=held, workers=2)
    for name in ("src.tokens", "src.offsets", "tgt.tokens", "tgt.offsets", "lines", "valid.jsonl"):
        assert (one.directory / name).read_bytes() == (two.directory / name).read_bytes(), name
    assert len(token_cache.read_valid(one.directory)) == len(held) == 25
    assert len(one) + len(held) == 500


def test_hold_out_is_the_in_memory_split_below_the_cap_and_capped_above():
    for count in (2, 61, 1000):
        pairs = list(range(count))
        _, valid = split_off_validation(pairs, seed=5)
        assert corpus.held_out_indices(count, 5).tolist() == valid
    assert len(corpus.held_out_indices(3_000_000, 0)) == corpus.VALID_CAP


def test_bpe_sample_is_bounded_and_spread_over_the_file(tmp_path):
    path = write_tsv(tmp_path / "c.tsv", 3000)
    scan = corpus.scan_corpus(path, "tsv", SEQ2SEQ, sample_size=100, seed=0)
    indices = [i for i, _ in scan.sample]
    assert len(indices) == 100 and indices == sorted(indices)
    assert indices[-1] > 2000  # a reservoir over the whole file, not its first lines
    small = corpus.scan_corpus(path, "tsv", SEQ2SEQ, sample_size=5000)
    assert [i for i, _ in small.sample] == list(range(3000))  # a small corpus: all of it
    held = corpus.held_out_indices(3000, 0)
    texts = list(corpus.sample_texts(small, held))
    assert len(texts) == 2 * (3000 - len(held))


def test_cache_key_changes_with_the_input_and_find_cache_checks_it(tmp_path):
    path = write_tsv(tmp_path / "c.tsv", 50)
    tok = ByteTokenizer()
    sha = token_cache.tokenizer_fingerprint(tok)
    key = token_cache.cache_key(path, "tsv", SEQ2SEQ, sha, 24, "skip")
    workdir = tmp_path / "run"
    workdir.mkdir()
    staged = token_cache.stage_dir(workdir)
    token_cache.build_cache(staged, corpus.scan_corpus(path, "tsv", SEQ2SEQ), tok, key)
    installed = token_cache.install_cache(staged, workdir, key)
    assert token_cache.find_cache(workdir, key) == installed
    assert not list(tmp_path.glob(".token_cache.partial-*"))
    for other in (dict(key, max_len=32), dict(key, on_long="truncate")):
        assert token_cache.key_name(other) != token_cache.key_name(key)
    write_tsv(path, 50, seed=1)  # the file changes: a new key, the old cache is not found
    changed = token_cache.cache_key(path, "tsv", SEQ2SEQ, sha, 24, "skip")
    assert changed != key and token_cache.find_cache(workdir, changed) is None


def installed_cache(tmp_path, path):
    """(run directory, key, cache directory) of a TSV corpus's installed cache."""
    tok = ByteTokenizer()
    key = token_cache.cache_key(
        path, "tsv", SEQ2SEQ, token_cache.tokenizer_fingerprint(tok), 24, "skip"
    )
    workdir = tmp_path / "run"
    workdir.mkdir()
    staged = token_cache.stage_dir(workdir)
    token_cache.build_cache(staged, corpus.scan_corpus(path, "tsv", SEQ2SEQ), tok, key)
    return workdir, key, token_cache.install_cache(staged, workdir, key)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-4]), "lengths has {} bytes, {} were written"),
        (lambda p: p.write_bytes(p.read_bytes()[::-1]), "lengths does not match its checksum"),
        (lambda p: p.unlink(), "lengths is missing"),
    ],
    ids=["cut short", "same size, other bytes", "missing"],
)
def test_a_damaged_cache_file_is_never_read(tmp_path, damage, message):
    """Each cache file's size and checksum are written with it and checked before use: a
    lengths file cut short was an IndexError on --resume."""
    workdir, key, cache = installed_cache(tmp_path, write_tsv(tmp_path / "c.tsv", 50))
    size = (cache / "lengths").stat().st_size
    damage(cache / "lengths")
    with pytest.raises(token_cache.DamagedCache) as err:
        token_cache.find_cache(workdir, key)
    assert str(err.value).startswith(f"the token cache {cache} is damaged (")
    assert message.format(size - 4, size) in str(err.value)


def test_the_key_follows_the_bytes_not_the_mtime(tmp_path):
    """A corpus rewritten with the same size and its mtime put back (cp -p, rsync -t) is a
    new key: the old tokens are not reused."""
    path = write_tsv(tmp_path / "c.tsv", 50)
    workdir, key, _ = installed_cache(tmp_path, path)
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace("chat", "tahc", 1))  # the same size
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    sha = key["tokenizer_sha256"]
    changed = token_cache.cache_key(path, "tsv", SEQ2SEQ, sha, 24, "skip")
    assert changed != key and token_cache.find_cache(workdir, changed) is None


def test_a_stage_left_by_a_killed_run_is_removed_by_the_next(tmp_path, capsys):
    """SIGKILL during tokenization leaves a staging directory (up to a copy of the tokens):
    the next run beside it removes it, saying so; a live process's stage is left alone."""
    import subprocess
    import sys

    workdir = tmp_path / "run"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    import socket

    abandoned = tmp_path / (token_cache.STAGE_PREFIX + "killed")
    abandoned.mkdir()
    (abandoned / token_cache.OWNER).write_text(f"{socket.gethostname()} {dead}\n")
    (abandoned / "tgt.tokens").write_bytes(b"\0" * 64)
    live = token_cache.stage_dir(workdir)  # this process: its stage stays
    assert not abandoned.exists() and live.exists()
    assert f"removed {abandoned}: left unfinished by a stopped run" in capsys.readouterr().err
    other = token_cache.stage_dir(workdir)
    assert live.exists() and other.exists()


def test_a_pipe_as_corpus_says_a_file_is_needed(tmp_path, capsys):
    """`--train-tsv <(cat ...)` cannot be read twice: one line saying so (it was "cannot read
    ... not seekable")."""
    import os

    fifo = tmp_path / "pipe.tsv"
    os.mkfifo(fifo)
    workdir = tmp_path / "run"
    code = train.main(["--train-tsv", str(fifo), "--workdir", str(workdir), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"TSV file {fifo} is a pipe or device, not a file" in err
    assert "write it to a file first" in err and not workdir.exists()


# ----------------------------------------------------------------------------- JSONL
def test_jsonl_records_and_kinds(tmp_path):
    seq = tmp_path / "s.jsonl"
    seq.write_text('{"source": "ab", "target": "ba"}\n\n{"target": "y", "source": "x"}\n')
    assert [(p.source, p.target) for p in corpus.read_records(seq, "jsonl")] == [
        ("ab", "ba"),
        ("x", "y"),
    ]
    assert corpus.jsonl_kind(seq) == SEQ2SEQ
    lm = tmp_path / "l.jsonl"
    lm.write_text('\ufeff{"text": "hello"}\n{"text": "world", "id": 3}\n', encoding="utf-8")
    assert corpus.jsonl_kind(lm) == LM
    assert [p.target for p in corpus.read_records(lm, "jsonl")] == ["hello", "world"]


def test_jsonl_source_reads_what_the_first_line_holds(tmp_path):
    """One read of a --train-jsonl's first non-blank line: conversations, an LM or seq2seq;
    a bad first line and an empty file are named as the readers name them."""
    files = {
        "chat": '\n{"messages": [{"role": "user", "content": "hi"}]}\n',
        "lm": '{"text": "hello"}\n',
        "seq2seq": '\n\n{"source": "a", "target": "b"}\n',
    }
    for wanted, text in files.items():
        (tmp_path / f"{wanted}.jsonl").write_text(text)
        assert corpus.jsonl_source(tmp_path / f"{wanted}.jsonl") == wanted
    (tmp_path / "bad.jsonl").write_text('{"source": "a"}\n')
    with pytest.raises(DataError, match='line 1: missing "target"'):
        corpus.jsonl_source(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="the file is empty"):
        corpus.jsonl_source(tmp_path / "empty.jsonl")


BAD_JSONL = [
    ('{"source": "a", "target": "b"}\n{"source": "a", "target": \n', "line 2: not valid JSON"),
    ('{"source": "a", "target": "b"}\n["a"]\n', "line 2: expected a JSON object, got an array"),
    ('{"source": "a", "target": "b"}\n{"source": "a"}\n', 'line 2: missing "target"'),
    ('{"source": "a", "target": 3}\n', 'line 1: "target" must be a string, got a number'),
    ('{"source": "a", "target": "b"}\n{"text": "c"}\n', 'line 2: expected "source" and "target"'),
    ('{"source": "", "target": "b"}\n', 'line 1: empty "source"'),
    ("\n\n", "the file is empty"),
    ('{"source": "a", "target": "b"}\n{"source": "x\\ud800", "target": "b"}\n',
     "line 2: \"source\" holds a lone surrogate '\\ud800' (character 2), which is not text"),
    ('{"source": "a", "target": "b"}\n' + "[" * 100_000 + "]" * 100_000 + "\n",
     "line 2: JSON nested too deeply to read"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_JSONL)
def test_bad_jsonl_is_exit_2_naming_the_file_and_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    workdir = tmp_path / "run"
    code = train.main(["--train-jsonl", str(path), "--workdir", str(workdir), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: JSONL file {path}" in err and message in err, err
    assert "Traceback" not in err
    assert not workdir.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_bad_line_deep_in_a_tsv_stops_before_anything_is_written(tmp_path, capsys):
    path = write_tsv(tmp_path / "c.tsv", 300)
    with path.open("a") as handle:
        handle.write("no tab here\n")
    workdir = tmp_path / "run"
    code = train.main(["--train-tsv", str(path), "--workdir", str(workdir), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and f"TSV file {path} line " in err and "no tab" in err
    assert not workdir.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.tsv"]


# ----------------------------------------------------------------------------- the command
TINY = [
    "--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32",
    "--max-len", "24", "--batch-size", "8", "--log-every", "2", "--dropout", "0",
    "--lr", "3e-3", "--warmup", "2", "--eval-every", "6", "--save-every", "3",
]  # fmt: skip


def run(capsys, *argv, hooks=()):
    code = train.main([str(a) for a in argv], hooks=hooks)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


@pytest.mark.slow  # ~45 s of training runs; CI runs it (`-m slow`)
def test_resume_reuses_the_cache_and_is_exact(tmp_path, capsys, monkeypatch):
    data = tmp_path / "c.jsonl"
    rng = np.random.default_rng(0)
    with data.open("w") as handle:
        for _ in range(150):  # 143 training examples: an epoch is 18 batches of 8
            words = rng.choice(WORDS, size=2)
            record = {"source": " ".join(words), "target": " ".join(words[::-1])}
            handle.write(json.dumps(record) + "\n")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    out, _ = run(capsys, *TINY, "--train-jsonl", data, "--steps", "6", "--workdir", straight)
    assert "held out 7 of 150 examples" in out
    run_json = json.loads((straight / "run.json").read_text())
    assert run_json["train_examples"] == 143 and run_json["valid_examples"] == 7

    def stop_at_3(info):
        return STOP if info.event == "step" and info.step == 3 else None

    run(capsys, *TINY, "--train-jsonl", data, "--steps", "6", "--workdir", stopped,
        hooks=[stop_at_3])  # fmt: skip
    (cache,) = (stopped / "token_cache").iterdir()
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    built = []
    original = token_cache.build_cache
    monkeypatch.setattr(
        token_cache, "build_cache", lambda *a, **k: built.append(1) or original(*a, **k)
    )
    out, _ = run(capsys, *TINY, "--train-jsonl", data, "--steps", "6", "--workdir", stopped,
                 "--resume")  # fmt: skip
    assert "resumed from step 3" in out and built == []  # never tokenized again
    assert f"reusing the token cache {cache}" in out
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    expected, _ = load_safetensors(straight / "flax_params.safetensors")
    actual, _ = load_safetensors(stopped / "flax_params.safetensors")
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)  # bit-exact
    # A cache file cut short: one line, and the cache is rebuilt (it was an IndexError).
    lengths = cache / "lengths"
    lengths.write_bytes(lengths.read_bytes()[:-4])
    out, err = run(capsys, *TINY, "--train-jsonl", data, "--steps", "7", "--workdir", stopped,
                   "--resume")  # fmt: skip
    assert f"warning: the token cache {cache} is damaged (lengths has" in err
    assert "it is rebuilt" in err and "Traceback" not in err and built == [1]
    # The input is rewritten with the same size and its mtime put back (cp -p, rsync -t): the
    # next --resume tokenizes it again, into a new cache (the key is the bytes, not the mtime).
    stat, text = data.stat(), data.read_text()
    data.write_text(text.replace("chat", "tahc", 1))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    out, _ = run(capsys, *TINY, "--train-jsonl", data, "--steps", "8", "--workdir", stopped,
                 "--resume")  # fmt: skip
    assert "tokenizing" in out and built == [1, 1]
    assert [p.name for p in (stopped / "token_cache").iterdir()] != [cache.name]
    assert len(list((stopped / "token_cache").iterdir())) == 1


def test_data_error_in_the_cache_pass_leaves_nothing(tmp_path, capsys):
    path = write_tsv(tmp_path / "c.tsv", 40, long_every=9)
    workdir = tmp_path / "run"
    code = train.main(
        [*TINY, "--train-tsv", str(path), "--workdir", str(workdir), "--on-long", "error"]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{path}:1: pair of" in err and "does not fit max_len 24" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.tsv"]  # no staging directory


@pytest.mark.slow  # two short runs (~15 s on 2 cores): CI runs it
def test_a_tsv_corpus_validates_on_a_jsonl_file_and_the_formats_are_checked(tmp_path, capsys):
    """Either validation format beside either corpus format; refused: two validation files,
    a validation file without a corpus file, pairs to validate a language model."""
    path = write_tsv(tmp_path / "c.tsv", 60)
    valid = tmp_path / "v.jsonl"
    valid.write_text("".join(json.dumps({"source": w, "target": w.upper()}) + "\n"
                             for w in WORDS[:5]))  # fmt: skip
    workdir = tmp_path / "run"
    run(capsys, *TINY, "--train-tsv", path, "--valid-jsonl", valid, "--steps", "1",
        "--workdir", workdir)  # fmt: skip
    assert json.loads((workdir / "run.json").read_text())["valid_examples"] == 5
    lm = tmp_path / "lm.jsonl"
    lm.write_text('{"text": "hello"}\n{"text": "world"}\n')
    refused = [
        (["--train-tsv", path, "--valid-tsv", path, "--valid-jsonl", valid],
         "choose one validation file, got --valid-tsv, --valid-jsonl"),
        (["--task", "copy", "--valid-jsonl", valid],
         "--valid-jsonl needs --train-tsv or --train-jsonl"),
        (["--train-jsonl", lm, "--valid-tsv", path], "--valid-tsv holds translation pairs"),
    ]  # fmt: skip
    for flags, message in refused:
        code = train.main([str(a) for a in [*flags, "--workdir", tmp_path / "no"]])
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
        assert not (tmp_path / "no").exists()
