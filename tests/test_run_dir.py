"""The run directory has one home (runs/run_dir.py): one writer per file, a trained run
holds exactly the files of its table, the docs list the same table; and the training command's
frictions: a partial --config, --dtype, plain logs, warnings once, a resume with nothing to do."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import train
from flax_transformer.runs import run_dir
from flax_transformer.runs.load import enable_x64_for, load_run
from flax_transformer.spec.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--task-min-len", "1", "--task-max-len", "4", "--task-train-size", "64",
    "--task-valid-size", "8", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "12", "--batch-size", "8", "--log-every", "1",
    "--dropout", "0", "--steps", "2", "--save-every", "2", "--eval-every", "2",
]  # fmt: skip


def run_main(capsys, *argv, hooks=()):
    code = train.main([str(a) for a in argv], hooks=hooks)
    out, err = capsys.readouterr()
    return code, out, err


def param_dtypes(tree) -> set[str]:
    return {str(leaf.dtype) for leaf in jax.tree.leaves(tree)}


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("runs") / "f32"
    seen = []
    stdout = io.StringIO()  # --json: the results alone on stdout (test_train_json)
    with contextlib.redirect_stdout(stdout):
        code = train.main([*TINY, "--workdir", str(workdir), "--json"], hooks=[seen.append])
    assert code == 0
    (workdir.parent / "stdout.json").write_text(stdout.getvalue())
    return workdir, seen


def test_train_json_is_the_results_alone_on_stdout(float32_run):
    workdir, _ = float32_run
    printed = json.loads((workdir.parent / "stdout.json").read_text())
    assert printed == run_dir.read_results(workdir) and printed["steps"] == 2


# ----------------------------------------------------------------------------- one writer
def test_only_run_dir_names_the_run_records():
    """No module but runs/run_dir.py (and training/run_files.py, for the loop's own files) builds
    a path from the record names: each file has one writer (write_run_json, write_results,
    append_metrics, ...) and one reader."""
    names = {run_dir.RUN_JSON, run_dir.RESULTS, run_dir.METRICS}
    offenders = []
    for path in [ROOT / "train.py", *sorted((ROOT / "flax_transformer").rglob("*.py"))]:
        homes = ("runs/run_dir.py", "training/run_files.py")
        if path in [ROOT / "flax_transformer" / home for home in homes]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == []


def test_run_json_has_the_same_keys_whoever_writes_it(tmp_path):
    trained = run_dir.write_run_json(tmp_path, model="seq2seq", tokenizer="byte", spec={})
    imported = run_dir.write_run_json(
        tmp_path, model="lm", tokenizer="hf", spec={}, carry=["hf_config.json"],
        imported_from="somewhere",
    )  # fmt: skip
    assert trained.keys() == imported.keys()
    assert run_dir.read_run_json(tmp_path) == imported
    assert run_dir.read_run_json(tmp_path / run_dir.RUN_JSON) == imported


def test_write_run_writes_a_new_runs_files_with_run_json_last(tmp_path):
    """A new classifier run from an init run: its config and tokenizer, the carried files as
    they are (its own hf_config.json over the carried one), labels.json, then run.json."""
    from flax_transformer.data.tokenizer import ByteTokenizer
    from flax_transformer.spec.config import TransformerConfig

    init = tmp_path / "init"
    init.mkdir()
    (init / run_dir.HF_CONFIG).write_text('{"carried": 1}')
    (init / run_dir.HF_GENERATION_CONFIG).write_text('{"max_length": 7}')
    workdir = tmp_path / "run"
    workdir.mkdir()
    carried = (run_dir.HF_CONFIG, run_dir.HF_GENERATION_CONFIG)
    config = TransformerConfig.from_dict(PRESETS["tiny"])
    new = run_dir.NewRun(config, ByteTokenizer(), init, carried, ("neg", "pos"), {"own": 2})
    info = run_dir.write_run(workdir, new, model="encoder", tokenizer="byte", spec={})
    assert run_dir.read_run_json(workdir) == info and info["carry"] == list(carried)
    assert json.loads((workdir / run_dir.HF_CONFIG).read_text()) == {"own": 2}
    assert (workdir / run_dir.HF_GENERATION_CONFIG).read_text() == '{"max_length": 7}'
    assert run_dir.read_labels(workdir) == ("neg", "pos")
    assert run_dir.read_config(workdir) == config
    last = (workdir / run_dir.RUN_JSON).stat().st_mtime_ns
    assert all(path.stat().st_mtime_ns <= last for path in workdir.iterdir())


def test_a_cut_record_reads_as_none(tmp_path):
    (tmp_path / run_dir.RUN_JSON).write_text('{"model": "seq2')
    (tmp_path / run_dir.RESULTS).write_text("[1, 2]")
    assert run_dir.read_run_json(tmp_path) is None
    assert run_dir.read_results(tmp_path) is None
    assert run_dir.read_results(tmp_path / "missing") is None


def test_a_trained_run_holds_exactly_the_files_of_the_table(float32_run):
    workdir, _ = float32_run
    expected = {
        entry.name.rstrip("/") for entry in run_dir.LAYOUT if entry.when in ("always", "seq2seq")
    }
    assert {p.name for p in workdir.iterdir()} == expected
    assert run_dir.read_results(workdir)["steps"] == 2
    assert run_dir.read_run_json(workdir)["model"] == "seq2seq"


def test_the_docs_table_lists_every_entry():
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("## Run directory", 1)[1].split("\n## ", 1)[0]
    rows = {re.match(r"\| `([^`]+)`", line).group(1) for line in section.splitlines()
            if re.match(r"\| `", line)}  # fmt: skip
    assert rows == {entry.name for entry in run_dir.LAYOUT}


# ----------------------------------------------------------------------------- the command
def test_the_command_runs_as_python_m_flax_transformer_train():
    result = subprocess.run(
        [sys.executable, "-m", "flax_transformer.train", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and "--dtype" in result.stdout and "--preset" in result.stdout
    from flax_transformer.cli.train import main

    assert train.main is main


# ----------------------------------------------------------------------------- --config
def test_a_partial_config_is_filled_from_the_preset_and_says_so(tmp_path, capsys):
    from flax_transformer.data.tokenizer import ByteTokenizer

    (tmp_path / "small.json").write_text(json.dumps({"d_model": 32, "num_heads": 2}))

    def spec(*argv):  # the TrainSpec of a command line
        return train.spec_from_args(train.parse_args([str(a) for a in argv]))

    config = train.make_config(spec("--config", tmp_path / "small.json"), ByteTokenizer(), tmp_path)
    small = PRESETS["small"]
    assert config.d_model == 32 and config.num_heads == 2
    for field in ("num_encoder_layers", "num_decoder_layers", "d_ff", "max_len"):
        assert getattr(config, field) == small[field], field  # not the 512-wide 6+6 defaults
    out = capsys.readouterr().out
    assert out.count("come from the small preset") == 1
    assert "small.json sets d_model, num_heads" in out and "num_encoder_layers" in out
    # Another preset fills from itself; a full file says nothing.
    tiny = spec("--config", tmp_path / "small.json", "--preset", "tiny")
    assert train.make_config(tiny, ByteTokenizer(), tmp_path).d_ff == PRESETS["tiny"]["d_ff"]
    assert "tiny preset" in capsys.readouterr().out
    config.save(tmp_path / "full.json")
    train.make_config(spec("--config", tmp_path / "full.json"), ByteTokenizer(), tmp_path)
    assert "preset" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- --dtype
@pytest.mark.parametrize(
    "dtype, compute, params",
    [
        # (bfloat16 in the slow set, with test_a_run_is_fine_tuned_in_bfloat16_with_init_from)
        pytest.param("bfloat16", "bfloat16", "float32", marks=pytest.mark.slow),
        pytest.param("float64", "float64", "float64", marks=pytest.mark.slow),  # 18 s
    ],
)
def test_dtype_trains_in_that_dtype(tmp_path, capsys, dtype, compute, params):
    seen = []
    code, out, _ = run_main(capsys, *TINY, "--dtype", dtype, "--workdir", tmp_path / "w",
                            hooks=[seen.append])  # fmt: skip
    assert code == 0
    assert param_dtypes(seen[-1].state.params) == {params}  # what the steps trained
    with jax.enable_x64(dtype == "float64"):  # (a float64 model is built with x64 on)
        run = load_run(tmp_path / "w")
    assert (run.config.dtype, run.config.param_dtype) == (compute, params)
    assert f"{compute} compute / {params} parameters" in out
    assert not jax.config.jax_enable_x64  # a float64 run leaves JAX as it found it
    if dtype == "float64":
        with jax.enable_x64(True):
            logits = _logits(run)
        assert logits.dtype == np.float64
        # Without x64 the float64 run would be built in float32: an error says so instead.
        with pytest.raises(ValueError, match="is a float64 run"):
            load_run(tmp_path / "w")
        try:  # what the commands that load a run (generate, export, parity) do first
            enable_x64_for(tmp_path / "w")
            assert jax.config.jax_enable_x64
        finally:
            jax.config.update("jax_enable_x64", False)
    else:
        assert _logits(run).dtype == jax.numpy.bfloat16


def test_float32_is_the_default_dtype(float32_run):
    workdir, seen = float32_run
    assert param_dtypes(seen[-1].state.params) == {"float32"}
    assert _logits(load_run(workdir)).dtype == np.float32


@pytest.mark.slow  # 13 s: two training runs
def test_a_run_is_fine_tuned_in_bfloat16_with_init_from(float32_run, tmp_path, capsys):
    init, _ = float32_run
    seen = []
    code, out, err = run_main(
        capsys, "--init-from", init, "--dtype", "bfloat16", "--steps", "2", "--batch-size", "8",
        "--task-train-size", "64", "--task-valid-size", "8", "--task-max-len", "4",
        "--workdir", tmp_path / "ft", hooks=[seen.append],
    )  # fmt: skip
    assert code == 0, err
    assert param_dtypes(seen[-1].state.params) == {"float32"}
    assert load_run(tmp_path / "ft").config.dtype == "bfloat16"


def _logits(run):
    src = jax.numpy.array([[5, 6, 2]])
    return run.model.apply(run.params, src, src)


# ----------------------------------------------------------------------------- logs
def test_logs_have_no_terminal_codes_and_a_plain_line_per_logged_step(float32_run, capsys):
    # The fixture's run printed into capsys (not a terminal): rerun its output check on a
    # resume, and on the run itself through its metrics (one plain line per logged step).
    workdir, _ = float32_run
    code, out, err = run_main(capsys, "--resume", "--workdir", workdir)
    assert code == 0
    for text in (out, err):
        assert "\r" not in text and "\x1b" not in text


@pytest.mark.slow  # 9 s; plain logs stay fast in test_logs_have_no_terminal_codes_...
def test_a_fresh_run_logs_plain_lines(tmp_path, capsys):
    code, out, err = run_main(capsys, *TINY, "--workdir", tmp_path / "w")
    assert code == 0
    assert "\r" not in out + err and "\x1b" not in out + err
    assert "step 1/2: train loss" in out and "step 2/2: train loss" in out


def test_resuming_a_finished_run_says_there_was_nothing_to_train(float32_run, capsys):
    workdir, _ = float32_run
    code, out, err = run_main(capsys, "--resume", "--workdir", workdir)
    assert code == 0
    assert "nothing to train: the run was already at step 2" in out
    assert "tok/s" not in out and "tokens/s" not in out
    assert "warning" not in err
    assert run_dir.read_results(workdir)["steps_trained"] == 0
    # The results name their run, and the summary says where they are from that.
    assert run_dir.read_results(workdir)["workdir"] == str(workdir)
    assert f"results: {workdir / run_dir.RESULTS};" in out


def test_the_warmup_warning_is_for_a_chosen_warmup_only(tmp_path, capsys):
    # The default warmup (150) is longer than a short run's --steps: no warning for that.
    missing = tmp_path / "no.tsv"  # the run stops at its input, after the options are built
    code, _, err = run_main(capsys, "--steps", "10", "--train-tsv", missing,
                            "--workdir", tmp_path / "w")  # fmt: skip
    assert code == 2 and "warning:" not in err, err
    code, _, err = run_main(capsys, "--steps", "10", "--warmup", "20", "--train-tsv", missing,
                            "--workdir", tmp_path / "w")  # fmt: skip
    assert code == 2 and err.count("warning: --warmup 20 is longer than --steps 10") == 1


def test_an_init_run_that_cannot_be_loaded_leaves_no_run_directory(
    float32_run, tmp_path, monkeypatch, capsys
):
    """The --init-from checkpoint is read (and checked against the new config) before the new
    run writes anything: a refused start leaves nothing that the next try would take for a
    run ("already holds a run")."""
    init, _ = float32_run

    def refused(init_dir, *args):
        raise ValueError(f"--init-from {init_dir}: config differs from the run's")

    monkeypatch.setattr("flax_transformer.runs.load.init_params_from", refused)
    workdir = tmp_path / "ft"
    code, _, err = run_main(capsys, "--init-from", init, "--steps", "2", "--workdir", workdir)
    assert code == 2
    assert (
        err.strip().splitlines()[-1] == f"error: --init-from {init}: config differs from the run's"
    )
    assert not workdir.exists()
