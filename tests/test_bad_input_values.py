"""Bad numbers, one table row per case: config fields, training options, every numeric flag of
every command and `--run-config` values are checked for type, finiteness and range before
anything runs (spec/validate.py). In-process and without JAX work: each row is a parse."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import train
from flax_transformer.cli import convert
from flax_transformer.cli import generate as generate_cli
from flax_transformer.cli import parity as parity_cli
from flax_transformer.data.tokenizer import BPETokenizer
from flax_transformer.decoding.strategies import Beam, Sample
from flax_transformer.spec.config import FIELD_RULES, TransformerConfig
from flax_transformer.spec.validate import Bool, Choice, Float, Int
from flax_transformer.training.options import DataOptions, OptionError, TrainOptions, rule_of

NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------- config fields
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("layer_norm_eps", NAN, "layer_norm_eps must be a finite number > 0, got nan"),
        ("layer_norm_eps", INF, "layer_norm_eps must be a finite number > 0, got inf"),
        ("layer_norm_eps", -1e-5, "layer_norm_eps must be a finite number > 0"),
        ("dropout_rate", NAN, "dropout_rate must be a finite number in [0, 1), got nan"),
        ("attention_dropout_rate", 1.0, "attention_dropout_rate must be a finite number in"),
        ("d_model", 32.0, "d_model must be a positive int, got 32.0"),
        ("d_model", True, "d_model must be a positive int, got True"),
        ("num_heads", "4", "num_heads must be a positive int, got '4'"),
        ("max_len", 0, "max_len must be a positive int, got 0"),
        ("num_encoder_layers", -1, "num_encoder_layers must be a non-negative int"),
        ("pad_id", -1, "pad_id must be a non-negative int, got -1"),
        ("pad_id", 1.0, "pad_id must be a non-negative int, got 1.0"),
        ("norm_first", 1, "norm_first must be true or false, got 1"),
        ("remat", "yes", "remat must be true or false"),
        ("dtype", "int8", "dtype must be one of"),
    ],
)
def test_config_fields_are_checked_for_type_finiteness_and_range(field, value, message):
    with pytest.raises(ValueError) as err:
        TransformerConfig(**{field: value})
    assert message in str(err.value)


def test_every_config_field_has_a_rule():
    # A field added without a rule would skip validation: this fails first.
    assert set(FIELD_RULES) == {f.name for f in dataclasses.fields(TransformerConfig)}


def test_every_option_field_has_a_rule_matching_its_type():
    for cls in (TrainOptions, DataOptions):
        for field in dataclasses.fields(cls):
            rule = rule_of(field)
            expected = {"int": Int, "float": Float, "bool": Bool}.get(str(field.type).split(" ")[0])
            if expected is not None:
                assert isinstance(rule, expected), (cls.__name__, field.name, rule)
            assert rule.problem(field.default) is None, field.name  # the defaults are valid
            if field.metadata.get("choices"):
                assert isinstance(rule, Choice)


@pytest.mark.parametrize(
    "cls, field, value, message",
    [
        (TrainOptions, "clip_norm", NAN, "clip_norm must be a finite number >= 0, got nan"),
        (TrainOptions, "weight_decay", NAN, "weight_decay must be a finite number >= 0"),
        (TrainOptions, "lr", INF, "lr must be a finite number > 0, got inf"),
        (TrainOptions, "steps", 10.5, "steps must be a positive int, got 10.5"),
        (TrainOptions, "seed", -1, "seed must be an int in [0, 4294967295]"),
        (TrainOptions, "early_stop", 0, "early_stop must be a positive int"),
        (TrainOptions, "schedule", "linear", "schedule must be one of"),
        (DataOptions, "bpe_vocab_size", 5, "bpe_vocab_size must be an int >= 259"),
        (DataOptions, "task_min_len", 0, "task_min_len must be a positive int"),
    ],
)
def test_options_name_the_field(cls, field, value, message):
    with pytest.raises(OptionError) as err:
        cls(**{field: value})
    assert err.value.field == field and message in str(err.value)


def test_warmup_longer_than_the_run_warns():
    with pytest.warns(UserWarning, match="--warmup 200 is longer than --steps 100"):
        TrainOptions(steps=100, warmup=200)


# ----------------------------------------------------------------------------- train.py flags
def train_error(capsys, *argv):
    code = train.main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--clip-norm", "nan"], "argument --clip-norm: must be a finite number >= 0, got nan"),
        (["--weight-decay", "nan"], "argument --weight-decay: must be a finite number >= 0"),
        (["--lr", "inf"], "argument --lr: must be a finite number > 0, got inf"),
        (["--lr", "abc"], "argument --lr: must be a number, got 'abc'"),
        (["--label-smoothing", "-0.1"], "argument --label-smoothing: must be a finite number"),
        (["--steps", "1.5"], "argument --steps: must be an int, got '1.5'"),
        (["--warmup", "0"], "argument --warmup: must be a positive int, got 0"),
        (["--batch-size", "-4"], "argument --batch-size: must be a positive int"),
        (["--seed", "-1"], "argument --seed: must be an int in [0, 4294967295]"),
        (["--keep-checkpoints", "0"], "argument --keep-checkpoints: must be a positive int"),
        (["--early-stop", "0"], "argument --early-stop: must be a positive int"),
        (["--task-train-size", "0"], "argument --task-train-size: must be a positive int"),
        (["--bpe-vocab-size", "5"], "argument --bpe-vocab-size: must be an int >= 259"),
        (["--dropout", "1.5"], "argument --dropout: must be a finite number in [0, 1)"),
        (["--dropout", "nan"], "argument --dropout: must be a finite number in [0, 1)"),
        (["--d-model", "0"], "argument --d-model: must be a positive int"),
        (["--max-len", "1e3"], "argument --max-len: must be an int, got '1e3'"),
        (["--num-heads", "3"], "model flags (--num-heads): invalid TransformerConfig: d_model"),
        (["--d-model", "30", "--num-heads", "4"], "model flags (--d-model, --num-heads)"),
        (["--task-min-len", "9", "--task-max-len", "3"], "--task-min-len (9) must be <= --task"),
        (["--grad-accum", "3"], "--grad-accum (3) must divide --batch-size (64)"),
    ],
)
def test_train_flags_are_usage_errors_naming_the_flag(tmp_path, capsys, argv, message):
    code, err = train_error(capsys, *argv, "--workdir", tmp_path / "w")
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()  # nothing written


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"layer_norm_eps": NaN}', "c.json: invalid TransformerConfig: layer_norm_eps must be"),
        ('{"d_model": "64"}', "d_model must be a positive int, got '64'"),
        ("{not json", "c.json: config is not valid JSON"),
    ],
)
def test_a_bad_config_file_is_a_usage_error(tmp_path, capsys, content, message):
    (tmp_path / "c.json").write_text(content)
    code, err = train_error(capsys, "--config", tmp_path / "c.json", "--workdir", tmp_path / "w")
    assert code == 2 and err.startswith("error: --config: ") and message in err, err
    assert not (tmp_path / "w").exists()


def test_warmup_longer_than_steps_warns_on_the_command_line(tmp_path, capsys):
    # --train-tsv of a missing file: the run stops at its input, after the options are built.
    code, err = train_error(
        capsys, "--steps", "10", "--warmup", "20", "--train-tsv", tmp_path / "no.tsv",
        "--workdir", tmp_path / "w",
    )  # fmt: skip
    assert code == 2 and "warning: --warmup 20 is longer than --steps 10" in err


@pytest.mark.parametrize(
    "values, message",
    [
        ({"lr": "abc"}, "--lr must be a finite number > 0, got 'abc'"),
        ({"lr": None}, "--lr must be a finite number > 0, got None"),
        ({"steps": 10.5}, "--steps must be a positive int, got 10.5"),
        ({"clip_norm": "nan"}, "--clip-norm must be a finite number >= 0, got 'nan'"),
        ({"dropout": 2}, "--dropout must be a finite number in [0, 1), got 2"),
        ({"resume": "yes"}, "--resume must be true or false, got 'yes'"),
        ({"schedule": "linear"}, "--schedule must be one of"),
        ({"workdir": 5}, "--workdir must be a string, got 5"),
        ({"d_model": True}, "--d-model must be a positive int, got True"),
    ],
)
def test_run_config_values_are_checked_before_anything_is_written(
    tmp_path, capsys, values, message
):
    run_config = tmp_path / "run.json"
    run_config.write_text(json.dumps({"args": values}))
    code, err = train_error(capsys, "--run-config", run_config, "--workdir", tmp_path / "w")
    assert code == 2, err
    assert err.startswith("error: --run-config: ") and message in err, err
    assert not (tmp_path / "w").exists()


# ----------------------------------------------------------------------------- other commands
def parse_exit(capsys, parse, argv):
    with pytest.raises(SystemExit) as exit_info:
        parse([str(a) for a in argv])
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sample", "--temperature", "-1"], "argument --temperature: must be a finite number"),
        (["--sample", "--temperature", "0"], "argument --temperature: must be a finite number > 0"),
        (["--sample", "--temperature", "nan"], "argument --temperature"),
        (["--sample", "--top-p", "0"], "argument --top-p: must be a finite number in (0, 1]"),
        (["--sample", "--top-p", "2"], "argument --top-p: must be a finite number in (0, 1]"),
        (["--sample", "--top-k", "-3"], "argument --top-k: must be a non-negative int"),
        (["--beam", "2", "--alpha", "-1"], "argument --alpha: must be a finite number >= 0"),
        (["--beam", "2", "--alpha", "inf"], "argument --alpha: must be a finite number >= 0"),
        (["--beam", "0"], "argument --beam: must be a positive int"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive int"),
        (["--max-new-tokens", "-2"], "argument --max-new-tokens: must be a positive int"),
        (["--seed", "x"], "argument --seed: must be an int, got 'x'"),
    ],
)
def test_generate_flags(tmp_path, capsys, argv, message):
    code, err = parse_exit(capsys, generate_cli.parse_args, ["--workdir", tmp_path, *argv])
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tol", "nan"], "argument --tol: must be a finite number > 0, got nan"),
        (["--tol", "-1"], "argument --tol: must be a finite number > 0"),
        (["--batch-size", "0"], "argument --batch-size: must be a positive int"),
        (["--src-len", "2.5"], "argument --src-len: must be an int"),
        (["--seed", "-1"], "argument --seed: must be an int in [0, 4294967295]"),
    ],
)
def test_parity_flags(capsys, argv, message):
    code, err = parse_exit(capsys, parity_cli.main, ["a.safetensors", "b.safetensors", *argv])
    assert code == 2 and message in err


def test_strategies_refuse_non_finite_numbers():
    for make, message in (
        (lambda: Sample(temperature=INF), "temperature must be a finite number >= 0"),
        (lambda: Sample(top_p=NAN), "top_p must be a finite number in (0, 1]"),
        (lambda: Sample(top_k=True), "top_k must be a non-negative int"),
        (lambda: Beam(2, alpha=-1.0), "alpha must be a finite number >= 0"),
        (lambda: Beam(0), "size must be a positive int"),
    ):
        with pytest.raises(ValueError) as err:
            make()
        assert message in str(err.value)
    assert math.isclose(Sample(0.5).temperature, 0.5)


def test_bpe_vocabulary_below_the_byte_alphabet_is_an_error():
    with pytest.raises(ValueError, match="BPE vocab_size 5 is below 259"):
        BPETokenizer.train(["some text"], vocab_size=5)
    assert BPETokenizer.train(["some text"], vocab_size=259).vocab_size == 259


@pytest.mark.parametrize(
    "output, message",
    [
        ("missing_dir/out.safetensors", "the directory"),
        ("in.safetensors", "is the input"),
        ("link.safetensors", "is the input"),
        (".", "output . contains the input in.safetensors"),
        ("empty", "is a directory"),
    ],
)
def test_convert_output_paths(tmp_path, monkeypatch, capsys, output, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "in.safetensors").write_bytes(b"original")
    (tmp_path / "link.safetensors").symlink_to(tmp_path / "in.safetensors")
    code, err = parse_exit(capsys, convert.main, ["in.safetensors", output])
    assert code == 2 and message in err, err
    assert (tmp_path / "in.safetensors").read_bytes() == b"original"
