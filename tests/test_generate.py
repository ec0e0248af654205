"""The generate command on fabricated train.py workdirs (config, tokenizer, Orbax checkpoint).

Its outputs are compared with `decoding.generate` on the batch the command decodes (the same
padding, so the same compiled loop: no extra compilation)."""

from __future__ import annotations

import io
import json

import jax
import numpy as np
import optax
import pytest

from flax_transformer import TransformerConfig
from flax_transformer.cli.generate import BUCKET, main
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.decoding import Beam, Greedy, Sample, generate
from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.runs.load import load_run
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.state import create_train_state

CONFIG = TransformerConfig(
    src_vocab_size=259, tgt_vocab_size=259, d_model=32, num_heads=4, d_ff=48,
    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0, max_len=24,
)  # fmt: skip
N_NEW = 6
LINES = ["hello", "abc", "a longer line"]  # every test decodes 3 lines: one compiled loop each


def fabricate_run(workdir, kind: str, checkpoint: bool = True):
    """What train.py leaves behind, with random weights."""
    workdir.mkdir()
    CONFIG.save(workdir / "config.json")
    (workdir / "run.json").write_text(json.dumps({"model": kind, "tokenizer": "byte"}))
    ByteTokenizer().save(workdir / "tokenizer.json")
    if checkpoint:
        model = model_for(CONFIG, kind)
        rng = np.random.default_rng(0)  # random weights without compiling an init
        params = jax.tree.map(
            lambda s: rng.normal(0.0, 0.3, s.shape).astype(s.dtype),
            abstract_variables(model)["params"],
        )
        state = create_train_state(model, optax.sgd(0.1), seed=0, params=params)
        checkpointer = Checkpointer(workdir / "checkpoints")
        checkpointer.save(state)
        checkpointer.close()
    return workdir


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
    return fabricate_run(tmp_path_factory.mktemp("runs") / "seq2seq", "seq2seq")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return fabricate_run(tmp_path_factory.mktemp("runs") / "lm", "lm")


def padded(rows: list[list[int]]) -> np.ndarray:
    """Rows right-padded with pad (0) to one BUCKET: the batch the command decodes."""
    assert max(map(len, rows)) <= BUCKET
    tokens = np.zeros((len(rows), BUCKET), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return tokens


def run_cli(args, stdin_text, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin_text))
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out.split("\n")[:-1], captured.err


def expected_text(tokens) -> str:
    ids = list(np.asarray(tokens))
    ids = ids[: ids.index(2)] if 2 in ids else ids  # cut at EOS
    return ByteTokenizer().decode(ids).replace("\r", "\\r").replace("\n", "\\n")


def source_batch() -> np.ndarray:
    tok = ByteTokenizer()
    return padded([tok.encode(line) + [tok.eos_id] for line in LINES])


def test_greedy_translation_matches_generate(seq2seq_run, monkeypatch, capsys):
    code, out, err = run_cli(
        ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)],
        "\n".join(LINES) + "\n",
        monkeypatch,
        capsys,
    )
    assert code == 0 and err == ""
    run = load_run(seq2seq_run)
    tokens = generate(
        run.model, run.params, source_batch(), Greedy(), max_new_tokens=N_NEW, bos_id=1, eos_id=2
    )
    assert out == [expected_text(row) for row in tokens]


@pytest.mark.slow
def test_beam_and_sampling_options(seq2seq_run, monkeypatch, capsys, tmp_path):
    text = "\n".join(LINES) + "\n"
    base = ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)]
    greedy = run_cli(base, text, monkeypatch, capsys)
    beam_one = run_cli(base + ["--beam", "1", "--alpha", "0"], text, monkeypatch, capsys)
    assert beam_one == greedy  # beam 1 is greedy
    run, common = load_run(seq2seq_run), dict(max_new_tokens=N_NEW, bos_id=1, eos_id=2)
    code, out, _ = run_cli(base + ["--beam", "3"], text, monkeypatch, capsys)
    best, _ = generate(run.model, run.params, source_batch(), Beam(3), **common)
    assert code == 0 and out == [expected_text(row) for row in best[:, 0]]
    (tmp_path / "in.txt").write_text(text)
    sample = base + ["--sample", "--temperature", "1.5", "--top-k", "20", "--seed", "3"]
    first = run_cli(sample + ["--input", str(tmp_path / "in.txt")], "", monkeypatch, capsys)
    again = run_cli(sample, text, monkeypatch, capsys)
    assert first == again and first[0] == 0  # same seed, same output
    key = jax.random.fold_in(jax.random.key(3), 0)  # the command's key for its first batch
    tokens = generate(run.model, run.params, source_batch(), Sample(1.5, 20), rng=key, **common)
    assert first[1] == [expected_text(row) for row in tokens]


def test_bad_lines_are_reported_and_keep_alignment(seq2seq_run, monkeypatch, capsys):
    too_long = "x" * CONFIG.max_len  # + EOS: one token over max_len
    code, out, err = run_cli(
        ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW)],
        f"abc\n\n{too_long}\nabc\nhello\n",  # 3 good lines: the greedy loop compiled above
        monkeypatch,
        capsys,
    )
    assert code == 2  # bad input
    assert len(out) == 5 and out[1] == "" and out[2] == "" and out[0] == out[3]
    assert "line 2: empty input" in err
    assert "line 3" in err and "longer than the model's max_len 24" in err


def test_json_lines_one_record_an_input_line(seq2seq_run, monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(
        ["--workdir", str(seq2seq_run), "--max-new-tokens", str(N_NEW), "--json"],
        "abc\n\nhello\n",  # the bad line keeps its place, empty
        monkeypatch,
        capsys,
    )
    records = [json.loads(line) for line in out]
    assert code == 2 and "line 2: empty input" in err
    assert [r["line"] for r in records] == [1, 2, 3] and records[1]["output"] == ""
    assert records[0]["output"] and records[2]["output"]
    # --json OUT: the text lines on stdout, the records in the file.
    code, text, _ = run_cli(
        [
            "--workdir",
            str(seq2seq_run),
            "--max-new-tokens",
            str(N_NEW),
            "--json",
            str(tmp_path / "o"),
        ],
        "abc\n\nhello\n",
        monkeypatch,
        capsys,
    )
    assert text == [r["output"] for r in records]
    written = (tmp_path / "o").read_text().splitlines()
    assert [json.loads(line) for line in written] == records


def test_bad_workdirs_and_flags(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nope"
    code, _, err = run_cli(["--workdir", str(missing)], "abc\n", monkeypatch, capsys)
    assert code == 2 and "is not a directory" in err
    empty = fabricate_run(tmp_path / "no_ckpt", "seq2seq", checkpoint=False)
    code, _, err = run_cli(["--workdir", str(empty)], "abc\n", monkeypatch, capsys)
    assert code == 2 and "no checkpoint" in err
    with pytest.raises(SystemExit):  # argparse: sampling flags without --sample
        main(["--workdir", str(empty), "--top-k", "5"])
    assert "--sample" in capsys.readouterr().err


def test_lm_run_continues_prompts(lm_run, monkeypatch, capsys):
    prompts = ["ab", "hello there"]
    code, out, err = run_cli(
        ["--workdir", str(lm_run), "--max-new-tokens", str(N_NEW), "--echo"],
        "\n".join(prompts) + "\n",
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    run, tok = load_run(lm_run), ByteTokenizer()
    ids = padded([[tok.bos_id] + tok.encode(prompt) for prompt in prompts])  # ragged prompts
    tokens = generate(run.model, run.params, ids, Greedy(), max_new_tokens=N_NEW, eos_id=2)
    assert out == [prompt + expected_text(row) for prompt, row in zip(prompts, tokens, strict=True)]
    code, _, err = run_cli(
        ["--workdir", str(lm_run), "--max-new-tokens", str(N_NEW)], "y" * 20 + "\n",
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 2 and "line 1" in err and "allows at most 19" in err
