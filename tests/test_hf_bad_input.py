"""A Hugging Face directory is never taken on trust: config.json values of the wrong type (as
transformers' config classes declare them), widths the heads do not divide, missing keys,
non-float and non-finite weights are refused, every problem named with its file and key, by
`hf.load` (one exception) and by `ftx hf import` (exit 2, one line per problem, nothing
written). Before these checks `"scale_embedding": "false"` loaded as True and int8 or NaN
weights loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from flax_transformer import hf
from flax_transformer.cli.main import main as ftx
from flax_transformer.hf.config import UnsupportedConfigError
from flax_transformer.spec.tree_check import ConversionError

from . import hf_models

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{model_type: its save_pretrained dir}; Marian with a tokenizer (what `hf import` needs)."""
    out = {}
    for model_type in ("marian", "bart", "mbart", "gpt2"):
        path = tmp_path_factory.mktemp(model_type)
        out[model_type] = hf_models.save(
            hf_models.build(model_type), path, tokenizer=model_type == "marian"
        )
    return out


def copy_with(source: Path, destination: Path, config=None, tensors=None) -> Path:
    """A copy of a save_pretrained dir; `config(dict)` edits config.json in place,
    `tensors(dict)` the safetensors state."""
    shutil.copytree(source, destination)
    if config is not None:
        data = json.loads((destination / "config.json").read_text())
        config(data)
        (destination / "config.json").write_text(json.dumps(data))  # NaN written as NaN
    if tensors is not None:
        state = load_file(str(destination / "model.safetensors"))
        tensors(state)
        save_file(state, str(destination / "model.safetensors"), metadata={"format": "pt"})
    return destination


def setter(**changes):
    return lambda config: config.update(changes)


def deleter(*names):
    def edit(config):
        for name in names:
            del config[name]

    return edit


def tensor_edit(key, make):
    def edit(state):
        state[key] = make(state[key])

    return edit


def with_value(value, at=(0, 0)):
    def make(array):
        array = array.copy()
        array[at] = value
        return array

    return make


FC1 = "model.encoder.layers.0.fc1.weight"
FC2 = "model.decoder.layers.1.fc2.weight"

# (name, model_type, config edit, what the message says)
BAD_CONFIGS = [
    (
        "string bool",
        "marian",
        setter(scale_embedding="false"),
        "scale_embedding: must be true or false (a JSON boolean), got the string 'false'",
    ),
    (
        "string int",
        "gpt2",
        setter(n_layer="2"),
        "n_layer: must be an integer >= 1, got the string '2'",
    ),
    (
        "string token id",
        "marian",
        setter(pad_token_id="63"),
        "pad_token_id: must be an integer or null, got the string '63'",
    ),
    (
        "string token id in a list",
        "bart",
        setter(eos_token_id=[2, "3"]),
        "eos_token_id: must be a token id (an integer) or a list of them or null, got [2, '3']",
    ),
    (
        "float width",
        "gpt2",
        setter(n_embd=24.5),
        "n_embd: must be an integer >= 1, got 24.5",
    ),
    (
        "bool as int",
        "mbart",
        setter(encoder_layers=True),
        "encoder_layers: must be an integer >= 1, got true",
    ),
    (
        "NaN dropout",
        "bart",
        setter(dropout=float("nan")),
        "dropout: must be a finite number in [0, 1] or null, got nan",  # BART: `float | None`,
    ),
    (
        "heads not dividing the width",
        "bart",
        setter(encoder_attention_heads=5, decoder_attention_heads=5),
        "d_model: 24 is not divisible by encoder_attention_heads=5",
    ),
    (
        "GPT-2 heads not dividing the width",
        "gpt2",
        setter(n_head=5),
        "n_embd: 24 is not divisible by n_head=5",
    ),
    (
        "missing key",
        "mbart",
        deleter("d_model"),
        "mbart config lacks d_model (required)",
    ),
    (
        "null activation",
        "marian",
        setter(activation_function=None),
        "activation_function: must be a string, got null",
    ),
    # Labels: transformers builds the head from one key while the weights follow the other.
    (
        "num_labels disagreeing with id2label",
        "bart",
        setter(num_labels=3, id2label={"0": "a", "1": "b"}),
        "num_labels: 3 disagrees with id2label, which names 2 labels (make them agree)",
    ),
    (
        "id2label keys that are not class ids",
        "bart",
        setter(id2label={"zero": "a", "one": "b"}),
        "id2label: keys must be class ids (integers), got the string 'zero'",
    ),
    (
        "id2label with a gap",
        "bart",
        setter(id2label={"0": "a", "2": "b"}),
        "id2label: class ids must be 0..1, got [0, 2]",
    ),
]

# (name, config edit) that gave tracebacks before these checks
BAD_WEIGHTS = [
    (
        "int8 tensor",
        tensor_edit(FC1, lambda a: np.clip(a * 100, -127, 127).astype(np.int8)),
        f"tensor '{FC1}' has dtype int8; weights must be floating point",
    ),
    (
        "bool tensor",
        tensor_edit(FC1, lambda a: a > 0),
        f"tensor '{FC1}' has dtype bool; weights must be floating point",
    ),
    (
        "NaN tensor",
        tensor_edit(FC2, with_value(np.nan)),
        f"tensor '{FC2}' has 1 non-finite value(s) (nan/inf)",
    ),
    (
        "inf tensor",
        tensor_edit(FC2, with_value(np.inf, at=(1, 2))),
        f"tensor '{FC2}' has 1 non-finite value(s) (nan/inf)",
    ),
]


@pytest.mark.parametrize(
    "model_type, edit, expected", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_a_bad_config_value_is_named_with_its_file_and_key(
    saved, tmp_path, model_type, edit, expected
):
    path = copy_with(saved[model_type], tmp_path / "model", config=edit)
    with pytest.raises(UnsupportedConfigError) as err:
        hf.load(path)
    message = str(err.value)
    assert message.startswith(f"{path / 'config.json'}: 1 problem(s)"), message
    assert f"\n  {expected}" in message, message


@pytest.mark.parametrize(
    "edit, expected", [c[1:] for c in BAD_WEIGHTS], ids=[c[0] for c in BAD_WEIGHTS]
)
def test_a_bad_weight_is_named_with_its_file_and_tensor(saved, tmp_path, edit, expected):
    path = copy_with(saved["marian"], tmp_path / "model", tensors=edit)
    with pytest.raises(ConversionError) as err:
        hf.load(path)
    message = str(err.value)
    assert message.startswith(f"{path / 'model.safetensors'}: 1 bad tensor(s)"), message
    assert f"\n  {expected}" in message, message
    if "floating point" in expected:
        assert "no quantized format is supported" in message


def test_every_config_problem_is_listed_at_once(saved, tmp_path):
    path = copy_with(
        saved["marian"],
        tmp_path / "model",
        config=setter(
            scale_embedding="true", vocab_size="64", encoder_attention_heads=7, is_decoder=True
        ),
    )
    with pytest.raises(UnsupportedConfigError) as err:
        hf.load(path)
    lines = str(err.value).splitlines()
    assert (
        lines[0]
        == f"{path / 'config.json'}: 4 problem(s) with this marian config (nothing was loaded):"
    )
    assert sorted(line.split(":")[0].split("=")[0].strip() for line in lines[1:]) == [
        "d_model",
        "is_decoder",
        "scale_embedding",
        "vocab_size",
    ]


def test_every_bad_tensor_is_listed_at_once(saved, tmp_path):
    def edit(state):
        state[FC1] = state[FC1].astype(np.int8)
        state[FC2] = with_value(np.nan)(state[FC2])

    path = copy_with(saved["marian"], tmp_path / "model", tensors=edit)
    with pytest.raises(ConversionError, match=r"2 bad tensor\(s\)") as err:
        hf.load(path)
    assert FC1 in str(err.value) and FC2 in str(err.value)


def test_an_integral_float_is_read_as_the_int(saved, tmp_path):
    """512.0 is 512 (as json compares them); the model loads and computes as before."""
    path = copy_with(saved["gpt2"], tmp_path / "model", config=setter(n_embd=24.0, n_layer=2.0))
    model = hf.load(path)
    assert model.config.d_model == 24 and type(model.config.d_model) is int
    assert model.hf_config["n_layer"] == 2 and type(model.hf_config["n_layer"]) is int
    same = hf.load(saved["gpt2"])
    assert model.config == same.config
    leaves = zip(jax.tree.leaves(model.variables), jax.tree.leaves(same.variables), strict=True)
    for ours, theirs in leaves:
        np.testing.assert_array_equal(ours, theirs)


def test_a_json_false_still_means_false(saved, tmp_path):
    path = copy_with(saved["marian"], tmp_path / "model", config=setter(scale_embedding=False))
    assert hf.load(path).config.scale_embeddings is False


@pytest.mark.parametrize(
    "config_edit, tensors_edit, expected",
    [
        (setter(scale_embedding="false"), None, BAD_CONFIGS[0][3]),
        (setter(encoder_attention_heads=5, decoder_attention_heads=5), None, "d_model: 24 is not"),
        (None, BAD_WEIGHTS[2][1], BAD_WEIGHTS[2][2]),
    ],
    ids=["string bool", "heads", "NaN tensor"],
)
def test_ftx_hf_import_refuses_with_exit_2_and_writes_nothing(
    saved, tmp_path, capsys, config_edit, tensors_edit, expected
):
    path = copy_with(saved["marian"], tmp_path / "model", config_edit, tensors_edit)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    run = tmp_path / "run"
    assert ftx(["hf", "import", str(path), "--workdir", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"\n  {expected}" in err and "Traceback" not in err, err
    assert not run.exists()
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"not json{", "tokenizer.json: not valid JSON (Expecting value at line 1 column 1)"),
        (b'{"model": 1', "tokenizer.json: not valid JSON (Expecting ',' delimiter at line 1"),
    ],
    ids=["not JSON", "cut short"],
)
def test_a_tokenizer_file_that_is_not_json_is_named(saved, tmp_path, capsys, content, expected):
    """transformers' own JSON error names no file: the import names it, exit 2."""
    path = copy_with(saved["marian"], tmp_path / "model")
    (path / "tokenizer.json").write_bytes(content)
    run = tmp_path / "run"
    assert ftx(["hf", "import", str(path), "--workdir", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{path}/{expected}" in err and "Traceback" not in err, err
    assert not run.exists()


def test_the_command_line_surface(saved, tmp_path):
    """`python -m flax_transformer.cli hf import` as a user runs it: exit 2, the file and key."""
    path = copy_with(saved["marian"], tmp_path / "model", config=setter(d_model="24"))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flax_transformer.cli",
            "hf",
            "import",
            str(path),
            "--workdir",
            str(run),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path / 'config.json'}: 1 problem(s)" in done.stderr
    assert "d_model: must be an integer >= 1, got the string '24'" in done.stderr
    assert "Traceback" not in done.stderr and not run.exists()


@pytest.mark.parametrize("model_type", ["marian", "bart", "mbart", "gpt2"])
def test_each_family_declares_the_types_transformers_declares(model_type):
    """Every field a family types is one its transformers config class declares, with the same
    type and the same null-ability (BartConfig's `int | None`, MBartConfig's `int`)."""
    import re

    from flax_transformer.hf.families import family_for
    from flax_transformer.hf.families.field_types import COMMON

    config_class = type(getattr(hf_models, f"{model_type}_config")())
    declared = config_class.__annotations__
    expected = {"int": {"int"}, "float": {"float", "int"}, "bool": {"bool"}}
    for name, field_type in {**COMMON, **family_for(model_type).field_types}.items():
        if name not in declared:
            assert name in COMMON, f"{config_class.__name__} declares no {name}"
            continue
        text = str(declared[name])
        names = set(re.findall(r"\b(int|float|bool|str|None)\b", text))
        if name in COMMON:  # shared across families: the kind agrees, null may be allowed more
            assert field_type.kind in ("token_ids", "strs") or names - {"None"} <= (
                expected.get(field_type.kind) or {field_type.kind}
            ), (name, text)
            continue
        assert names - {"None"} <= expected[field_type.kind], (name, text)
        assert names - {"None"} >= {field_type.kind}, (name, text)
        assert ("None" in names) == field_type.optional, (name, text)
