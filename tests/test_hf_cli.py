"""python -m flax_transformer.hf import / export, and what runs in between: the generate CLI
decodes an imported Marian model with its transformers tokenizer, train.py --init-from
fine-tunes it, and the export loads in transformers with the Flax logits."""

import json
import random

import jax
import numpy as np
import pytest

import train
from flax_transformer import hf
from flax_transformer.cli import generate as generate_cli
from flax_transformer.cli.hf import main as hf_main
from flax_transformer.runs.load import load_run
from flax_transformer.spec.numerics import assert_close
from flax_transformer.training.checkpoint import CheckpointReadError

from . import hf_models


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(HF dir, run dir imported from it) of a tiny random Marian model with a tokenizer."""
    root = tmp_path_factory.mktemp("hf_cli")
    hf_dir = hf_models.save(hf_models.build("marian", seed=2), root / "hf", tokenizer=True)
    assert hf_main(["import", str(hf_dir), str(root / "run")]) == 0
    return hf_dir, root / "run"


def test_import_writes_a_train_py_run(imported):
    hf_dir, run_dir = imported
    run = load_run(run_dir)
    model = hf.load(hf_dir)
    assert run.config == model.config and run.model_kind == "seq2seq"
    for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(model.variables), strict=True):
        np.testing.assert_array_equal(a, b)
    tok = run.tokenizer
    assert (tok.kind, tok.bos_id, tok.eos_id, tok.pad_id) == ("hf", 63, 0, 63)  # Marian: pad starts
    assert tok.encode("a b w3") == [2, 3, 31] and tok.decode([2, 3, 31, 0, 63]) == "a b w3"
    run_info = json.loads((run_dir / "run.json").read_text())
    assert run_info["carry"] == ["hf_config.json", "hf_generation_config.json"]


@pytest.mark.slow  # two decoders compiled: the CLI's KV-cached loop and the forward pass
def test_generate_cli_decodes_with_the_imported_tokenizer(imported, tmp_path, capsys):
    """The CLI's greedy output is the greedy chain of the imported model's forward pass."""
    hf_dir, run_dir = imported
    (tmp_path / "in.txt").write_text("a b c\nw1 w2\n")
    assert generate_cli.main(["--workdir", str(run_dir), "--input", str(tmp_path / "in.txt"),
                              "--max-new-tokens", "5"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    model = hf.load(hf_dir)
    tok = load_run(run_dir).tokenizer
    for text, line in zip(("a b c", "w1 w2"), lines, strict=True):
        source = np.array([tok.encode(text) + [tok.eos_id]])
        decoded = np.full((1, 6), tok.pad_id)  # one width, one compilation: causal, so
        chosen = []  # position t only sees the tokens decided before it
        while len(chosen) < 5:
            token = int(model.forward(source, None, decoded)[0, len(chosen)].argmax())
            if token == tok.eos_id:
                break
            chosen.append(token)
            decoded[0, len(chosen)] = token
        assert line == tok.decode(chosen)


def test_export_of_the_import_is_the_original(imported, tmp_path):
    hf_dir, run_dir = imported
    assert hf_main(["export", str(run_dir), str(tmp_path / "out")]) == 0
    from safetensors.numpy import load_file

    before = load_file(str(hf_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(before) == sorted(after)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_export_restores_each_parameter_when_it_is_written(imported, tmp_path, capsys):
    """hf export reads the run lazily (load_run(lazy=True)): each parameter a LazyArray that
    restores its layer from the checkpoint when read, equal to the eager restore (read twice
    too); nothing is read before it is asked for. A damaged checkpoint is one line, exit 2, and
    no HF_DIR."""
    import shutil

    from flax_transformer.interop.safetensors_stream import LazyArray

    _, run_dir = imported
    eager = load_run(run_dir).params
    lazy = load_run(run_dir, lazy=True).params
    leaves = jax.tree.leaves(lazy, is_leaf=lambda x: isinstance(x, LazyArray))
    assert leaves and all(isinstance(leaf, LazyArray) for leaf in leaves)
    paths = jax.tree_util.tree_flatten_with_path(eager)[0]
    assert len(paths) == len(leaves)
    for (path, value), leaf in zip(paths, leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(leaf), value, err_msg=str(path))
    np.testing.assert_array_equal(np.asarray(leaves[-1]), paths[-1][1])  # read again
    damaged = tmp_path / "run"
    shutil.copytree(run_dir, damaged)
    opened = load_run(damaged, lazy=True).params  # the arrays are read when written
    for path in sorted((damaged / "checkpoints" / "0" / "params").rglob("d/*")):
        path.unlink()
    with pytest.raises(CheckpointReadError, match="checkpoint step 0 .*: parameters .* cannot be"):
        np.asarray(jax.tree.leaves(opened, is_leaf=lambda x: isinstance(x, LazyArray))[0])
    assert hf_main(["export", str(damaged), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint step 0" in err and "is missing (deleted?)" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_cli_errors(imported, tmp_path, capsys):
    hf_dir, run_dir = imported
    assert hf_main(["import", str(hf_dir), str(run_dir)]) == 2  # never over an existing run
    assert "is not an empty directory; nothing was written" in capsys.readouterr().err
    no_tokenizer = hf_models.save(hf_models.build("bart"), tmp_path / "bart")
    assert hf_main(["import", str(no_tokenizer), str(tmp_path / "run")]) == 2
    assert "no tokenizer files" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    (tmp_path / "plain").mkdir()
    assert hf_main(["export", str(tmp_path / "plain"), str(tmp_path / "out")]) == 2
    assert "no hf_config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        hf_main(["convert", "a", "b"])
    assert exit_info.value.code == 2
    flags = ["--init-from", str(run_dir), "--train-tsv", "x.tsv", "--workdir", str(tmp_path / "w")]
    assert train.main([*flags, "--d-model", "32"]) == 2
    assert (
        "--init-from takes the run's config; do not also give --d-model" in capsys.readouterr().err
    )
    assert train.main([*flags, "--tokenizer", "bpe"]) == 2
    assert "takes the run's tokenizer" in capsys.readouterr().err
    flags[1] = str(tmp_path / "plain")
    assert train.main(flags) == 2
    assert "not a run directory (no run.json)" in capsys.readouterr().err


@pytest.mark.slow
def test_fine_tune_with_init_from_then_export_to_transformers(imported, tmp_path):
    """Import -> train.py --init-from, 20 steps on a tiny TSV -> export -> transformers loads
    it strictly and gives the fine-tuned Flax model's logits (float32, 1e-5)."""
    from transformers import AutoModelForSeq2SeqLM

    _, run_dir = imported
    rng = random.Random(0)
    lines = []
    for _ in range(48):
        words = rng.choices(hf_models.WORDS[:20], k=rng.randint(2, 5))
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)))
    (tmp_path / "train.tsv").write_text("\n".join(lines[:44]) + "\n")
    (tmp_path / "valid.tsv").write_text("\n".join(lines[44:]) + "\n")
    workdir = tmp_path / "tuned"
    argv = ["--init-from", run_dir, "--train-tsv", tmp_path / "train.tsv", "--valid-tsv",
            tmp_path / "valid.tsv", "--workdir", workdir, "--steps", 20, "--batch-size", 8,
            "--warmup", 5, "--lr", 3e-3, "--eval-every", 20, "--save-every", 20]  # fmt: skip
    assert train.main([str(a) for a in argv]) == 0
    tuned = load_run(workdir)
    assert tuned.config == load_run(run_dir).config and tuned.tokenizer.kind == "hf"
    start = jax.tree.leaves(load_run(run_dir).params)
    moved = [
        float(np.abs(a - b).max())
        for a, b in zip(jax.tree.leaves(tuned.params), start, strict=True)
    ]
    assert max(moved) > 1e-3  # it trained
    assert hf_main(["export", str(workdir), str(tmp_path / "out")]) == 0
    reloaded, info = AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    assert not any(info.values()), info
    flax_logits, hf_logits = hf_models.logits_pair(
        "marian", reloaded.eval(), tmp_path / "out", "float32"
    )
    assert_close(flax_logits, hf_logits, rtol=1e-5, what="fine-tuned Marian logits")
    exported = hf.load(tmp_path / "out")
    for a, b in zip(
        jax.tree.leaves(exported.variables), jax.tree.leaves(tuned.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # 20 s: a fine-tuning run, then an export
def test_an_import_fine_tunes_in_bfloat16_and_exports(imported, tmp_path):
    """--init-from an imported model with --dtype bfloat16: bf16 compute on the float32
    weights, and the run still exports (its dtype is the run's, not the model's)."""
    _, run_dir = imported
    lines = ["a b\tb a", "w3 a\ta w3", "b b a\ta b b", "a w3 b\tb w3 a"] * 4
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    seen = []
    argv = ["--init-from", run_dir, "--train-tsv", tmp_path / "train.tsv", "--dtype", "bfloat16",
            "--workdir", tmp_path / "bf16", "--steps", 2, "--batch-size", 4, "--warmup", 1,
            "--eval-every", 2, "--save-every", 2]  # fmt: skip
    assert train.main([str(a) for a in argv], hooks=[seen.append]) == 0
    assert {str(p.dtype) for p in jax.tree.leaves(seen[-1].state.params)} == {"float32"}
    tuned = load_run(tmp_path / "bf16")
    assert (tuned.config.dtype, tuned.config.param_dtype) == ("bfloat16", "float32")
    assert tuned.config.replace(dtype="float32") == load_run(run_dir).config
    assert hf_main(["export", str(tmp_path / "bf16"), str(tmp_path / "out")]) == 0
    assert hf.load(tmp_path / "out").config.dtype == "float32"


def test_the_workflows_run_without_a_command_line(imported, tmp_path):
    """runs.hf: hf_import / hf_export from typed specs, each outcome naming what it wrote (the
    model read back from the run); paths that cannot be written are UsageErrors, checked
    before anything is converted."""
    from flax_transformer.runs.hf import HFExportSpec, HFImportSpec, hf_export, hf_import
    from flax_transformer.runs.spec import UsageError

    hf_dir, run_dir = imported
    outcome = hf_import(HFImportSpec(hf_dir, tmp_path / "run"))
    assert (outcome.command, outcome.output, outcome.hf_dir) == ("import", tmp_path / "run", hf_dir)
    assert outcome.model["family"] == "marian" and outcome.model["kind"] == "seq2seq"
    assert outcome.model == hf_export(HFExportSpec(run_dir, tmp_path / "out")).model
    assert "model.safetensors" in hf_export(HFExportSpec(run_dir, tmp_path / "o2")).files
    with pytest.raises(UsageError, match="does not exist"):
        hf_import(HFImportSpec(tmp_path / "missing", tmp_path / "run2"))
    with pytest.raises(UsageError, match="--out"):
        hf_export(HFExportSpec(run_dir, run_dir / "inside"))
    assert not (tmp_path / "run2").exists() and not (run_dir / "inside").exists()
