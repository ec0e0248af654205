"""Bad values inside the data, one table row per case: token ids outside the vocabulary, batch
sizes that disagree, text with a BOM or invalid UTF-8, weights that are not floating point or not
finite, and output files that must never be half-written. In-process; the model is never
compiled except for the one row that documents what happens inside jit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import train
from flax_transformer import Transformer, TransformerLM, preset
from flax_transformer.cli import convert as convert_cli
from flax_transformer.cli.parity import main as parity_main
from flax_transformer.data.pipeline import (
    DataError,
    check_dataset_ids,
    encode_pairs,
    read_text_lines,
    read_tsv,
)
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.decoding import Greedy, generate
from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.interop import convert
from flax_transformer.interop.convert import (
    ConversionError,
    flax_to_torch_state,
    load_flax_params,
    load_torch_state,
    save_flax_params,
    save_torch_state,
    torch_state_to_flax,
)
from flax_transformer.nn.kinds import abstract_variables

CONFIG = preset("tiny")  # src vocab 40, tgt vocab 44
SRC = np.array([[5, 6, 7, 0], [8, 9, 0, 0]])
TGT = np.array([[1, 10, 11], [1, 12, 0]])


@pytest.fixture(scope="module")
def variables():
    """Random weights of the tiny seq2seq model, without compiling an init."""
    rng = np.random.default_rng(0)
    abstract = abstract_variables(Transformer(CONFIG))
    return jax.tree.map(lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), abstract)


# ----------------------------------------------------------------------------- token ids
@pytest.mark.parametrize(
    "src, tgt, message",
    [
        ([[5, -3, 0, 0]], [[1, 2]], "src holds token id -3 at position (0, 1), outside the vocab"),
        ([[5, 40, 0, 0]], [[1, 2]], "src holds token id 40 at position (0, 1), outside"),
        ([[5, 6]], [[1, 44]], "tgt holds token id 44 at position (0, 1), outside the vocabulary"),
        (SRC, TGT[:1], "src of shape (2, 4) and tgt of shape (1, 3) disagree on the batch size"),
        (SRC[:1], TGT, "src of shape (1, 4) and tgt of shape (2, 3) disagree on the batch size"),
    ],
)  # fmt: skip
def test_model_outside_jit_rejects_bad_ids_and_batches(variables, src, tgt, message):
    with pytest.raises(ValueError) as err:
        Transformer(CONFIG).apply(variables, np.array(src), np.array(tgt))
    assert message in str(err.value)


def test_lm_and_encode_check_ids_too(variables):
    lm = TransformerLM(CONFIG)
    lm_vars = jax.tree.map(np.zeros_like, abstract_variables(lm))
    with pytest.raises(ValueError, match=r"tokens holds token id 99 at position \(0, 2\)"):
        lm.apply(lm_vars, np.array([[1, 5, 99]]))
    with pytest.raises(ValueError, match="src holds token id -1"):
        Transformer(CONFIG).apply(variables, np.array([[-1, 3]]), method="encode")


def test_inside_jit_ids_are_not_checked_as_documented(variables):
    # What docs/bad-input.md says: under jit there are no values to check; an id >= vocab
    # looks up a row of NaN (which attention spreads to every position: 0 * NaN is NaN), a
    # negative id wraps to a row counted from the end.
    apply = jax.jit(Transformer(CONFIG).apply)
    too_big = np.asarray(apply(variables, np.array([[5, 6]]), np.array([[1, 44]])))
    assert np.isnan(too_big).all()
    wrapped = apply(variables, np.array([[5, -1]]), np.array([[1, 2]]))
    same = apply(variables, np.array([[5, 39]]), np.array([[1, 2]]))
    np.testing.assert_array_equal(np.asarray(wrapped), np.asarray(same))


@pytest.mark.parametrize(
    "inputs, kwargs, message",
    [
        ([[5, 45, 2]], {}, "src holds token id 45"),
        ([[5, -2, 2]], {}, "src holds token id -2"),
        ([[5, 6, 2]], {"bos_id": 44}, "bos_id 44 is outside the target vocabulary [0, 44)"),
        ([[5, 6, 2]], {"eos_id": -5}, "eos_id -5 is outside the target vocabulary"),
    ],
)
def test_generate_api_rejects_ids_outside_the_vocabulary(variables, inputs, kwargs, message):
    kw = {"max_new_tokens": 3, "bos_id": 1, "eos_id": 2} | kwargs
    with pytest.raises(ValueError) as err:
        generate(Transformer(CONFIG), variables, np.array(inputs), Greedy(), **kw)
    assert message in str(err.value)


def test_generate_api_rejects_bad_lm_prompts_and_top_k():
    from flax_transformer.decoding import Sample

    lm = TransformerLM(CONFIG)
    lm_vars = jax.tree.map(np.zeros_like, abstract_variables(lm))
    with pytest.raises(ValueError, match="prompts holds token id 50"):
        generate(lm, lm_vars, np.array([[1, 50]]), Greedy(), max_new_tokens=2, eos_id=2)
    with pytest.raises(ValueError, match=r"Sample top_k 45 is larger than the vocabulary \(44\)"):
        generate(lm, lm_vars, np.array([[1, 5]]), Sample(top_k=45), max_new_tokens=2, eos_id=2,
                 rng=jax.random.key(0))  # fmt: skip


def test_datasets_with_ids_outside_the_vocabulary_name_the_line(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("ab\tcd\nxy\tz\n")
    dataset = encode_pairs(read_tsv(path), ByteTokenizer(), max_len=16)
    check_dataset_ids(dataset, 259)  # the tokenizer's own vocabulary: fine
    with pytest.raises(DataError, match=r"d.tsv:1: token id \d+ is outside the model's vocab"):
        check_dataset_ids(dataset, 100)


# ----------------------------------------------------------------------------- text
@pytest.mark.parametrize(
    "reader, content, expected",
    [
        (read_tsv, "\ufeffab\tcd\nef\tgh\n", [("ab", "cd"), ("ef", "gh")]),
        (read_tsv, "\ufeffab\tcd\r\nef\tgh", [("ab", "cd"), ("ef", "gh")]),
        (read_text_lines, "\ufeffhello\nworld\n", [("", "hello"), ("", "world")]),
    ],
)
def test_a_bom_is_dropped_from_the_first_line(tmp_path, reader, content, expected):
    path = tmp_path / "in.txt"
    path.write_bytes(content.encode("utf-8"))
    assert [(p.source, p.target) for p in reader(path)] == expected


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xef\xbb\xbf", "the file is empty"),
        (b"ab\tcd\n\xc3\x28\tx\n", "line 2: not valid UTF-8 (byte 0xc3 at column 1)"),
        (b"\xef\xbb\xbfab\tcd\tef\n", "line 1: 2 tabs"),
    ],
)
def test_bad_text_is_named_by_file_and_line(tmp_path, capsys, content, message):
    path = tmp_path / "x.tsv"
    path.write_bytes(content)
    code = train.main(["--train-tsv", str(path), "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()  # a run that fails on its input leaves no workdir


# ----------------------------------------------------------------------------- weights
@pytest.fixture(scope="module")
def weight_files(tmp_path_factory, variables):
    """A good torch-format file, an int32 copy, and a copy with one NaN."""
    root = tmp_path_factory.mktemp("weights")
    state = flax_to_torch_state(jax.tree.map(np.asarray, variables))
    save_torch_state(root / "good.safetensors", state, CONFIG)
    ints = {k: (v * 100).astype(np.int32) for k, v in state.items()}
    save_torch_state(root / "int.safetensors", ints, CONFIG)
    nan = dict(state)
    nan["encoder.layers.0.ffn.linear1.weight"] = state["encoder.layers.0.ffn.linear1.weight"].copy()
    nan["encoder.layers.0.ffn.linear1.weight"][0, 0] = np.nan
    save_torch_state(root / "nan.safetensors", nan, CONFIG)
    return root, state


@pytest.mark.parametrize(
    "name, extra, code, message",
    [
        ("int", [], 2, "'decoder.layers.0.ffn.linear1.weight' has dtype int32; weights must"),
        ("nan", [], 2, "tensor 'encoder.layers.0.ffn.linear1.weight' has 1 non-finite value(s)"),
        ("nan", [], 2, "--allow-nonfinite to accept"),
        ("nan", ["--allow-nonfinite"], 0, "converted torch -> flax: "),
        ("good", [], 0, "converted torch -> flax: "),
    ],
)  # fmt: skip
def test_convert_refuses_integer_and_non_finite_weights(
    weight_files, tmp_path, capsys, name, extra, code, message
):
    root, _ = weight_files
    out = tmp_path / "out.safetensors"
    assert convert_cli.main([str(root / f"{name}.safetensors"), str(out), *extra]) == code
    captured = capsys.readouterr()
    assert message in captured.out + captured.err
    assert out.exists() == (code == 0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize("loader", [load_flax_params, load_torch_state])
def test_every_weight_loader_checks_values(weight_files, loader):
    root, _ = weight_files
    with pytest.raises(ConversionError, match="has dtype int32"):
        loader(root / "int.safetensors")
    with pytest.raises(ConversionError, match="non-finite"):
        loader(root / "nan.safetensors")
    loader(root / "nan.safetensors", allow_nonfinite=True)


def test_in_memory_conversion_refuses_integer_weights(weight_files):
    _, state = weight_files
    ints = dict(state, **{"tgt_embed.weight": state["tgt_embed.weight"].astype(np.int64)})
    with pytest.raises(ConversionError, match="'tgt_embed.weight' has dtype int64"):
        torch_state_to_flax(ints, CONFIG)


def test_the_torch_twin_refuses_integer_weights(weight_files):
    import torch_reference

    _, state = weight_files
    ints = dict(state, **{"src_embed.weight": state["src_embed.weight"].astype(np.int32)})
    with pytest.raises(ConversionError, match="'src_embed.weight' has dtype int32"):
        torch_reference.load_numpy_state(torch_reference.Transformer(CONFIG), ints)


def test_parity_refuses_non_finite_weights_as_bad_input(weight_files, capsys):
    root, _ = weight_files
    assert parity_main([str(root / "nan.safetensors"), str(root / "good.safetensors")]) == 2
    assert "non-finite" in capsys.readouterr().err


# ----------------------------------------------------------------------------- atomic writes
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, variables):
    path = tmp_path / "w.safetensors"
    save_flax_params(path, variables, CONFIG)
    before = path.read_bytes()
    import safetensors

    with pytest.raises(safetensors.SafetensorError):  # safetensors cannot store strings
        convert.save_safetensors(
            path, {"x": np.array(["text"])}, config=CONFIG, fmt="flax", model="seq2seq"
        )
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]
    atomic_write_text(tmp_path / "a.json", "new")
    assert (tmp_path / "a.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "w.safetensors"]


def test_every_writer_goes_through_atomic_io():
    # Output files of the product are written by atomic_io only (grep-style guard).
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    pattern = re.compile(
        r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wa]b?['\"]|savefig\(\w+[,)]|torch\.save\("
    )
    for path in [root / "train.py", *sorted((root / "flax_transformer").rglob("*.py"))]:
        if path.name == "atomic_io.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line) and "atomic" not in line:
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    # Allowed: the workdir write probe, metrics.jsonl appends (cut back atomically on resume),
    # the token cache's files, appended inside a staging directory that is renamed into the run
    # directory whole (token_cache.build_cache / install_cache), a stage's owner file (inside
    # the stage, files/stages.py), and a kernel library's manifest (written in a temporary
    # directory, then renamed into the cache) and its build lock (kernels/build.py).
    allowed = ("probe.write_text", 'open("a")', "tmp.write_bytes", "savefig(tmp", "token_cache.py:",
               "stages.py:", "build.py:")  # fmt: skip
    assert [o for o in offenders if not any(a in o for a in allowed)] == []
