"""Flags that would do nothing or break later, and inputs that gave unclear errors (issue #24):
each is refused (exit 2, or a ValueError in Python) or warned about before anything is
written, with a message that names the flag, file or argument (docs/bad-input.md, "Flags and
inputs checked before anything is written")."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from flax_transformer import TransformerConfig
from flax_transformer.cli import generate as generate_cli
from flax_transformer.cli import launch as launcher
from flax_transformer.cli import train
from flax_transformer.data.pipeline import Pair, overlap_warning
from flax_transformer.data.tokenizer import ByteTokenizer, load_tokenizer
from flax_transformer.spec.config import MAX_LEN_LIMIT, check_config_for_kind, kind_problems

TINY = ["--d-model", "16", "--num-heads", "2", "--d-ff", "16", "--num-layers", "1"]


def parse_error(parse, argv, capsys) -> str:
    """The argparse error of `parse(argv)` (it must exit with status 2)."""
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- generate
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--alpha", "0.6"], "--alpha needs --beam: greedy decoding"),
        (["--sample", "--alpha", "1"], "--alpha needs --beam: sampling (--sample)"),
        (["--top-k", "0"], "--top-k needs --sample: greedy decoding"),  # the default value too
        (["--beam", "2", "--temperature", "0.5"], "--temperature needs --sample: beam search"),
        (["--top-p", "0.9", "--top-k", "3"], "--top-k, --top-p need --sample"),
    ],
)
def test_generate_refuses_search_flags_that_would_do_nothing(tmp_path, capsys, flags, message):
    err = parse_error(generate_cli.main, ["--workdir", str(tmp_path), *flags], capsys)
    assert message in err


def test_generate_search_flags_with_their_search_and_defaults():
    args = generate_cli.parse_args(["--workdir", "w", "--beam", "3", "--alpha", "1.0"])
    assert (args.strategy.size, args.strategy.alpha) == (3, 1.0)
    args = generate_cli.parse_args(["--workdir", "w", "--sample", "--top-k", "5"])
    assert (args.strategy.top_k, args.strategy.top_p, args.strategy.temperature) == (5, 1.0, 1.0)
    args = generate_cli.parse_args(["--workdir", "w"])  # the defaults are still filled in
    assert (args.alpha, args.temperature, args.top_k, args.top_p) == (0.6, 1.0, 0, 1.0)


def test_generate_names_a_damaged_tokenizer_json(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    TransformerConfig(d_model=16, num_heads=2, d_ff=16).save(run / "config.json")
    (run / "run.json").write_text(json.dumps({"model": "seq2seq", "tokenizer": "bpe"}))
    (run / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": 5}}))
    assert generate_cli.main(["--workdir", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'tokenizer.json'}: not a valid tokenizer file" in err
    assert "Traceback" not in err


def test_load_tokenizer_names_the_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": 5}}))
    with pytest.raises(ValueError, match=f"{path}: not a valid tokenizer file"):
        load_tokenizer(path)


# ----------------------------------------------------------------------------- launch
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_launch_grace_must_be_finite(capsys, value):
    err = parse_error(
        launcher.parse_args, ["--processes", "2", "--grace", value, "--", "x.py"], capsys
    )
    assert f"argument --grace: must be a finite number >= 0, got {float(value)!r}" in err


@pytest.mark.parametrize(
    "command, message",
    [
        (["no_such_script.py"], "the command's script no_such_script.py does not exist"),
        (["-m", "no_such_module_xyz"], "the command's module no_such_module_xyz (-m) cannot"),
        (["no-such-program-xyz"], "the command no-such-program-xyz is not a file and not on PATH"),
    ],
)
def test_launch_of_a_missing_command_is_one_line(tmp_path, monkeypatch, capsys, command, message):
    monkeypatch.chdir(tmp_path)
    assert launcher.main(["--processes", "2", "--", *command]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {message}") and captured.err.count("\n") == 1
    assert captured.err.endswith("; nothing was started\n") and captured.out == ""


def test_launch_of_a_missing_script_subprocess(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "flax_transformer.launch", "--processes", "2", "--", "nope.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr == "error: the command's script nope.py does not exist; nothing was started\n"
    )
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- parity --json
def test_parity_json_into_a_missing_directory_names_it_and_reads_nothing(tmp_path):
    """Refused when the flags are read: before the (here missing) inputs are opened."""
    report = tmp_path / "no_such_dir" / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "flax_transformer.parity", "a.safetensors", "b.safetensors",
         "--json", str(report)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith(f"--json {report}: the directory {report.parent} does not exist")
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- model config
def test_config_max_len_has_a_documented_cap():
    TransformerConfig(max_len=MAX_LEN_LIMIT)
    with pytest.raises(ValueError, match=r"max_len 100000000 is larger than 65536, the longest"):
        TransformerConfig(max_len=100_000_000)


def test_layers_a_model_kind_needs():
    no_decoder = TransformerConfig(num_decoder_layers=0)
    assert kind_problems(no_decoder, "lm") == [
        "a decoder-only LM needs num_decoder_layers >= 1, got 0"
    ]
    assert kind_problems(no_decoder, "seq2seq") == [
        "a seq2seq model needs num_decoder_layers >= 1, got 0"
    ]
    no_encoder = TransformerConfig(num_encoder_layers=0)
    assert kind_problems(no_encoder, "lm") == []  # an LM has no encoder (GPT-2 imports say 0)
    with pytest.raises(ValueError, match="seq2seq model needs num_encoder_layers >= 1, got 0"):
        check_config_for_kind(no_encoder, "seq2seq")


@pytest.mark.parametrize(
    "model, layers, message",
    [
        ("Transformer", "num_decoder_layers", "a seq2seq model needs num_decoder_layers >= 1"),
        ("TransformerLM", "num_decoder_layers", "a decoder-only LM needs num_decoder_layers >= 1"),
        ("TransformerEncoder", "num_encoder_layers", "a bare encoder needs num_encoder_layers"),
    ],
)
def test_the_python_api_refuses_a_model_without_the_layers_it_needs(model, layers, message):
    """Through the Python API too (the command line refused it already): a seq2seq model
    with no decoder layers would otherwise build a decoder that never reads its source."""
    import jax

    import flax_transformer

    module = getattr(flax_transformer, model)(TransformerConfig(**{layers: 0}))
    tokens = np.ones((1, 3), np.int32)
    inputs = (tokens, tokens) if model == "Transformer" else (tokens,)
    with pytest.raises(ValueError, match=message):
        module.init(jax.random.PRNGKey(0), *inputs)


@pytest.mark.slow  # ~8 s
def test_a_seq2seq_model_without_encoder_layers_is_still_a_function():
    """Its decoder reads the source's embeddings (the twins agree on it, parity_tests/
    test_properties.py); only the commands ask a seq2seq run for encoder layers."""
    import jax

    import flax_transformer

    tokens = np.ones((1, 3), np.int32)
    model = flax_transformer.Transformer(TransformerConfig(num_encoder_layers=0))
    variables = model.init(jax.random.PRNGKey(0), tokens, tokens)
    assert model.apply(variables, tokens, tokens).shape[:2] == (1, 3)


# ----------------------------------------------------------------------------- train
def train_main(argv, capsys):
    code = train.main(argv)
    return code, capsys.readouterr().err


def test_train_refuses_zero_layers_before_writing(tmp_path, capsys):
    workdir = tmp_path / "run"
    code, err = train_main(["--workdir", str(workdir), *TINY, "--num-layers", "0"], capsys)
    assert code == 2 and "argument --num-layers: must be a positive int, got 0" in err
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"num_decoder_layers": 0}))
    code, err = train_main(["--workdir", str(workdir), "--config", str(config)], capsys)
    assert code == 2
    assert "seq2seq model needs num_decoder_layers >= 1, got 0" in err and "--config" in err
    assert not workdir.exists()


def test_train_refuses_a_huge_max_len_before_writing(tmp_path, capsys):
    workdir = tmp_path / "run"
    code, err = train_main(["--workdir", str(workdir), *TINY, "--max-len", "100000000"], capsys)
    assert code == 2
    assert "model flags (--d-model, --num-heads, --num-layers, --d-ff, --max-len)" in err
    assert "max_len 100000000 is larger than 65536" in err
    assert not workdir.exists()


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_train_warns_when_validation_is_training(tmp_path, capsys):
    # --on-long error stops the run after the warning and before anything is written.
    data = write_lines(tmp_path / "d.tsv", ["ab\tba", "cd\tdc", "a much longer line\tx"])
    workdir = tmp_path / "run"
    argv = ["--workdir", str(workdir), *TINY, "--max-len", "8", "--on-long", "error"]
    code, err = train_main([*argv, "--train-tsv", str(data), "--valid-tsv", str(data)], capsys)
    assert code == 2
    assert (
        "warning: the validation set is the training set (3 identical pairs): scores will not "
        "measure generalisation"
    ) in err
    assert err.count("warning: the validation set") == 1
    assert not workdir.exists()


def test_overlap_warning_for_mostly_shared_pairs():
    train_pairs = [Pair(s, s[::-1], f"t.tsv:{i}") for i, s in enumerate(["ab", "cd", "ef", "gh"])]
    mostly = [Pair("ab", "ba", "v:1"), Pair("cd", "dc", "v:2"), Pair("xy", "yx", "v:3")]
    assert overlap_warning(train_pairs, mostly) == (
        "2 of 3 validation pairs also occur in the training set: scores will overstate "
        "generalisation"
    )
    half = [Pair("ab", "ba", "v:1"), Pair("xy", "yx", "v:2")]
    assert overlap_warning(train_pairs, half) is None
    assert overlap_warning(train_pairs, []) is None
    subset = train_pairs[:2]  # every validation pair seen, but not the whole training set
    assert overlap_warning(train_pairs, subset).startswith("2 of 2 validation pairs")


def test_train_names_the_validation_file_whose_pairs_are_all_too_long(tmp_path, capsys):
    train_tsv = write_lines(tmp_path / "train.tsv", ["ab\tba", "cd\tdc"])
    valid_tsv = write_lines(tmp_path / "valid.tsv", ["a long source line\tx", "another one\ty"])
    workdir = tmp_path / "run"
    argv = ["--workdir", str(workdir), *TINY, "--max-len", "8", "--train-tsv", str(train_tsv)]
    code, err = train_main([*argv, "--valid-tsv", str(valid_tsv)], capsys)
    assert code == 2
    assert f"error: {valid_tsv}: no pair fits max_len 8 (all 2 are longer" in err
    assert not workdir.exists()


def test_train_init_from_a_run_without_checkpoint_writes_nothing(tmp_path, capsys):
    init = tmp_path / "init"
    init.mkdir()
    TransformerConfig(d_model=16, num_heads=2, d_ff=16, max_len=16).save(init / "config.json")
    ByteTokenizer().save(init / "tokenizer.json")
    (init / "run.json").write_text(json.dumps({"model": "seq2seq", "tokenizer": "byte"}))
    before = {p.name: p.read_bytes() for p in init.iterdir()}
    workdir = tmp_path / "new"
    code, err = train_main(["--workdir", str(workdir), "--init-from", str(init)], capsys)
    assert code == 2
    assert f"--init-from {init}: the run has no checkpoint in {init / 'checkpoints'}" in err
    assert not workdir.exists()
    assert {p.name: p.read_bytes() for p in init.iterdir()} == before


# ----------------------------------------------------------------------------- Python API
@pytest.fixture(scope="module")
def tiny_models():
    import jax

    from flax_transformer.nn.kinds import abstract_variables, model_for

    config = TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=8, num_heads=2, d_ff=8,
        num_encoder_layers=1, num_decoder_layers=1, max_len=16,
    )  # fmt: skip
    models = {}
    for kind in ("seq2seq", "lm"):
        model = model_for(config, kind)
        rng = np.random.default_rng(0)
        params = jax.tree.map(
            lambda s, rng=rng: rng.normal(0.0, 0.3, s.shape).astype(s.dtype),
            abstract_variables(model),
        )
        models[kind] = (model, params)
    return models


BAD_TOKENS = [
    (np.ones((2, 3), np.float32), "must hold integer token ids, got dtype float32 (shape (2, 3))"),
    (np.ones((2, 3, 1), np.int32), "must be a (batch, length) array of token ids, got a 3-D"),
    (np.zeros((0, 3), np.int32), "is an empty batch (shape (0, 3))"),
    (np.zeros((2, 0), np.int32), "has rows of length 0 (shape (2, 0))"),
    ([[1, 2], [3]], "its rows have different lengths (right-pad them with the pad id)"),
]


@pytest.mark.parametrize("tokens, message", BAD_TOKENS)
@pytest.mark.parametrize("kind, name", [("seq2seq", "src"), ("lm", "prompts")])
def test_generate_api_names_bad_token_arrays(tiny_models, kind, name, tokens, message):
    from flax_transformer.decoding import Greedy, generate

    model, variables = tiny_models[kind]
    extra = {"bos_id": 1} if kind == "seq2seq" else {}
    with pytest.raises(ValueError) as err:
        generate(model, variables, tokens, Greedy(), eos_id=2, max_new_tokens=3, **extra)
    assert str(err.value).startswith(name) and message in str(err.value)
