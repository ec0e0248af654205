"""The generate command on fabricated train.py workdirs (config, tokenizer, Orbax checkpoint)."""

from __future__ import annotations

import io
import json

import numpy as np
import optax
import pytest

from flax_transformer import TransformerConfig
from flax_transformer.decoding.cli import main
from flax_transformer.decoding.search import greedy_decode, lm_greedy_decode
from flax_transformer.nn.kinds import model_for
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.run import load_run
from flax_transformer.training.state import create_train_state
from flax_transformer.training.tokenizer import ByteTokenizer

CONFIG = TransformerConfig(
    src_vocab_size=259, tgt_vocab_size=259, d_model=32, num_heads=4, d_ff=48,
    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0, max_len=24,
)  # fmt: skip
N_NEW = 6


def fabricate_run(workdir, kind: str, checkpoint: bool = True):
    """What train.py leaves behind, with random weights."""
    workdir.mkdir()
    CONFIG.save(workdir / "config.json")
    (workdir / "run.json").write_text(json.dumps({"model": kind, "tokenizer": "byte"}))
    ByteTokenizer().save(workdir / "tokenizer.json")
    if checkpoint:
        state = create_train_state(model_for(CONFIG, kind), optax.sgd(0.1), seed=0)
        checkpointer = Checkpointer(workdir / "checkpoints")
        checkpointer.save(state)
        checkpointer.close()
    return workdir


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
    return fabricate_run(tmp_path_factory.mktemp("runs") / "seq2seq", "transformer")


def run_cli(args, stdin_text, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin_text))
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out.split("\n")[:-1], captured.err


def expected_text(tokens) -> str:
    ids = list(np.asarray(tokens))
    ids = ids[: ids.index(2)] if 2 in ids else ids  # cut at EOS
    return ByteTokenizer().decode(ids).replace("\r", "\\r").replace("\n", "\\n")


def test_greedy_translation_matches_greedy_decode(seq2seq_run, monkeypatch, capsys):
    lines = ["hello", "abc", "a longer line"]
    code, out, err = run_cli(
        ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)],
        "\n".join(lines) + "\n",
        monkeypatch,
        capsys,
    )
    assert code == 0 and err == ""
    run, tok = load_run(seq2seq_run), ByteTokenizer()
    for line, got in zip(lines, out, strict=True):
        src = np.array([tok.encode(line) + [tok.eos_id]])
        tokens = greedy_decode(run.model, run.params, src, max_new_tokens=N_NEW, bos_id=1, eos_id=2)
        assert got == expected_text(tokens[0])


@pytest.mark.slow
def test_beam_and_sampling_options(seq2seq_run, monkeypatch, capsys, tmp_path):
    text = "hello\nabc\n"
    base = ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)]
    greedy = run_cli(base, text, monkeypatch, capsys)
    beam_one = run_cli(base + ["--beam", "1", "--alpha", "0"], text, monkeypatch, capsys)
    assert beam_one == greedy  # beam 1 is greedy
    code, out, _ = run_cli(base + ["--beam", "3"], text, monkeypatch, capsys)
    assert code == 0 and len(out) == 2
    (tmp_path / "in.txt").write_text(text)
    sample = base + ["--sample", "--temperature", "1.5", "--top-k", "20", "--seed", "3"]
    first = run_cli(sample + ["--input", str(tmp_path / "in.txt")], "", monkeypatch, capsys)
    again = run_cli(sample, text, monkeypatch, capsys)
    assert first == again and first[0] == 0  # same seed, same output


def test_bad_lines_are_reported_and_keep_alignment(seq2seq_run, monkeypatch, capsys):
    too_long = "x" * CONFIG.max_len  # + EOS: one token over max_len
    code, out, err = run_cli(
        ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)],
        f"abc\n\n{too_long}\nabc\n",
        monkeypatch,
        capsys,
    )
    assert code == 1
    assert len(out) == 4 and out[1] == "" and out[2] == "" and out[0] == out[3]
    assert "line 2: empty input" in err
    assert "line 3" in err and "longer than the model's max_len 24" in err


def test_bad_workdirs_and_flags(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nope"
    code, _, err = run_cli(["--workdir", str(missing)], "abc\n", monkeypatch, capsys)
    assert code == 2 and "is not a directory" in err
    empty = fabricate_run(tmp_path / "no_ckpt", "transformer", checkpoint=False)
    code, _, err = run_cli(["--workdir", str(empty)], "abc\n", monkeypatch, capsys)
    assert code == 2 and "no checkpoint" in err
    with pytest.raises(SystemExit):  # argparse: sampling flags without --sample
        main(["--workdir", str(empty), "--top-k", "5"])
    assert "--sample" in capsys.readouterr().err


def test_lm_run_continues_prompts(tmp_path, monkeypatch, capsys):
    workdir = fabricate_run(tmp_path / "lm", "lm")
    code, out, err = run_cli(
        ["--workdir", str(workdir), "--max-new-tokens", str(N_NEW), "--echo"],
        "ab\nhello there\n",
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    run, tok = load_run(workdir), ByteTokenizer()
    for prompt, got in zip(["ab", "hello there"], out, strict=True):
        ids = np.array([[tok.bos_id] + tok.encode(prompt)])
        tokens = lm_greedy_decode(run.model, run.params, ids, max_new_tokens=N_NEW, eos_id=2)
        assert got == prompt + expected_text(tokens[0])
    code, _, err = run_cli(
        ["--workdir", str(workdir), "--max-new-tokens", str(N_NEW)], "y" * 20 + "\n",
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 1 and "line 1" in err and "allows at most 19" in err
