"""Bad workdirs and checkpoints, one table row per case, on fabricated train.py workdirs (random
weights, no training): generate's input lines and flags, a config.json that does not match its
checkpoint, damaged checkpoints (restore falls back, nothing deleted), a checkpoint directory
that stops being writable, and run.json files cut short. The trained end-to-end versions are in
test_bad_input_training.py (slow)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess

import jax
import numpy as np
import optax
import pytest

import train
from flax_transformer.cli.generate import main as generate_main
from flax_transformer.files.atomic_io import atomic_path
from flax_transformer.nn.kinds import model_for
from flax_transformer.runs.load import RunLoadError, load_run, open_run
from flax_transformer.training.checkpoint import (
    Checkpointer,
    CheckpointReadError,
    CheckpointWriteError,
)
from flax_transformer.training.state import create_train_state

from .test_generate import CONFIG, fabricate_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return fabricate_run(tmp_path_factory.mktemp("bad_runs") / "seq2seq", "seq2seq")


def run_generate(monkeypatch, capsys, workdir, stdin: bytes, *flags):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    argv = ["--workdir", str(workdir), "--max-new-tokens", "4", *map(str, flags)]
    code = generate_main(argv)
    captured = capsys.readouterr()
    return code, captured.out.split("\n")[:-1], captured.err


# ----------------------------------------------------------------------------- generate input
def test_invalid_utf8_lines_are_reported_and_the_others_decoded(
    run_dir, tmp_path, monkeypatch, capsys
):
    stdin = b"\xef\xbb\xbfhello\nab\xffc\n\nhello\n"  # BOM, an invalid byte, an empty line
    code, out, err = run_generate(monkeypatch, capsys, run_dir, stdin)
    assert code == 2 and "Traceback" not in err
    assert "line 2: not valid UTF-8 (byte 0xff at column 3)" in err
    assert "line 3: empty input" in err and "line 1" not in err and "line 4" not in err
    assert len(out) == 4 and out[1] == out[2] == ""
    assert out[0] == out[3] != ""  # the BOM is gone: line 1 is "hello", as line 4
    # The same bytes from --input: the same report and outputs (one compiled loop, reused).
    path = tmp_path / "in.txt"
    path.write_bytes(stdin)
    code, from_file, file_err = run_generate(monkeypatch, capsys, run_dir, b"", "--input", path)
    assert (code, from_file, file_err) == (2, out, err)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sample", "--top-k", "260"], "--top-k 260 is larger than the model's vocabulary (259"),
        (["--max-new-tokens", "25"], "--max-new-tokens 25 is longer than the model's max_len 24"),
    ],
)
def test_flags_checked_against_the_loaded_model(run_dir, monkeypatch, capsys, flags, message):
    monkeypatch.setattr("sys.argv", ["generate"])
    code = generate_main(["--workdir", str(run_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_a_tokenizer_beyond_the_models_vocabulary_is_a_bad_line(tmp_path, monkeypatch, capsys):
    # A run whose config has 100 tokens but whose tokenizer.json is the byte tokenizer (259).
    import flax_transformer.spec.config as config_module

    from . import test_generate

    small = CONFIG.replace(src_vocab_size=100, tgt_vocab_size=100)
    monkeypatch.setattr(test_generate, "CONFIG", small)
    workdir = test_generate.fabricate_run(tmp_path / "run", "seq2seq")
    assert config_module.TransformerConfig.load(workdir / "config.json") == small
    code, out, err = run_generate(monkeypatch, capsys, workdir, b"zz\n")
    assert code == 2 and out == [""]
    assert "line 1: the tokenizer gives id 125, outside the model's vocabulary [0, 100)" in err


@pytest.mark.parametrize(
    "change, fields",
    [
        ({"d_model": 64, "num_heads": 4}, "d_model: 64 in config.json, 32 in the checkpoint"),
        ({"d_ff": 64}, "d_ff: 64 in config.json, 48 in the checkpoint"),
        ({"num_decoder_layers": 2}, "num_decoder_layers: 2 in config.json, 1 in the checkpoint"),
        ({"tgt_vocab_size": 300}, "tgt_vocab_size: 300 in config.json, 259 in the checkpoint"),
    ],
)
def test_a_config_that_does_not_match_its_checkpoint(run_dir, tmp_path, capsys, change, fields):
    workdir = tmp_path / "run"
    shutil.copytree(run_dir, workdir)
    config = json.loads((workdir / "config.json").read_text()) | change
    (workdir / "config.json").write_text(json.dumps(config))
    assert generate_main(["--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "config.json does not match checkpoint step 0" in err and fields in err
    assert ("shape mismatch for" in err or "missing param" in err) and "Traceback" not in err


# ----------------------------------------------------------------------------- checkpoints
def tiny_state(step: int):
    model = model_for(CONFIG, "seq2seq")
    from flax_transformer.nn.kinds import abstract_variables

    rng = np.random.default_rng(step)
    params = jax.tree.map(
        lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), abstract_variables(model)["params"]
    )
    state = create_train_state(model, optax.sgd(0.1), seed=0, params=params)
    return state.replace(step=jax.numpy.asarray(step, jax.numpy.int32))


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    """A checkpoints/ directory with steps 1, 2, 3."""
    directory = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    states = {step: tiny_state(step) for step in (1, 2, 3)}
    for state in states.values():
        checkpointer.save(state, {"epoch": 0, "index": int(state.step)})
    checkpointer.close()
    return directory, states


def damage_files(step_dir, how):
    data = sorted((step_dir / "params").rglob("d/*"))
    for path in data:
        if how == "delete":
            path.unlink()
        else:
            path.write_bytes(path.read_bytes()[:20])


@pytest.mark.parametrize(
    "how, damaged, why",
    [
        ("delete", [3], "is missing (deleted?)"),
        ("truncate", [3], "bytes, "),
        ("delete", [3, 2], "is missing (deleted?)"),
    ],
)
def test_restore_falls_back_to_the_newest_good_checkpoint(
    three_checkpoints, tmp_path, how, damaged, why
):
    source, states = three_checkpoints
    directory = tmp_path / "checkpoints"
    shutil.copytree(source, directory)
    for step in damaged:
        damage_files(directory / str(step), how)
    checkpointer = Checkpointer(directory, keep=None, create=False)
    abstract = jax.eval_shape(lambda: states[1])
    set_aside = tmp_path / "unrestorable"
    state, loader, skipped = checkpointer.restore_newest(abstract, set_aside)
    checkpointer.close()
    good = 3 - len(damaged)
    assert int(state.step) == good and loader == {"epoch": 0, "index": good}
    jax.tree.map(np.testing.assert_array_equal, state.params, states[good].params)
    assert [step for step, _ in skipped] == damaged
    for step, message in skipped:
        assert f"checkpoint step {step}" in message and why in message, message
        assert "Zstd" not in message
        assert (set_aside / str(step) / "params").is_dir()  # moved aside, not deleted
    assert sorted(int(p.name) for p in directory.iterdir()) == list(range(1, good + 1))


def test_generate_names_a_damaged_checkpoint(run_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(run_dir, workdir)
    damage_files(workdir / "checkpoints" / "0", "delete")
    assert generate_main(["--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint step 0" in err and "is missing (deleted?)" in err
    assert "Zstd" not in err and "Traceback" not in err


def test_a_damaged_checkpoint_names_the_other_steps(run_dir, tmp_path):
    """load_run of a damaged step names the run's other checkpoints, to pick with --checkpoint;
    an undamaged one loads as before."""
    workdir = tmp_path / "run"
    shutil.copytree(run_dir, workdir)
    shutil.copytree(workdir / "checkpoints" / "0", workdir / "checkpoints" / "5")
    damage_files(workdir / "checkpoints" / "0", "delete")
    with pytest.raises(CheckpointReadError, match=r"step 0 .* \(others: steps 5; --checkpoint"):
        load_run(workdir, checkpoint=0)
    assert load_run(workdir).step == 5


def make_unwritable(directory) -> bool:
    """Make `directory` refuse new files: chattr +i as root (root ignores modes), else chmod."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
        return done.returncode == 0
    directory.chmod(0o555)
    return True


def make_writable(directory) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
    else:
        directory.chmod(0o755)


def test_an_unwritable_checkpoint_directory_is_one_clear_error(tmp_path):
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    checkpointer.save(tiny_state(1))
    checkpointer.wait()
    if not make_unwritable(directory):
        pytest.skip("cannot make a directory unwritable here (chattr refused)")
    try:
        with pytest.raises(CheckpointWriteError) as err:
            checkpointer.save(tiny_state(2))
        checkpointer.close()  # quiet after the failure was reported
    finally:
        make_writable(directory)
    assert err.value.step == 2
    assert str(err.value).startswith(f"cannot write checkpoint step 2 into {directory} (")
    assert checkpointer.finished_steps() == [1]
    assert Checkpointer(directory, create=False).restore_params(tiny_state(1).params, 1)


def test_no_checkpoint_restores(three_checkpoints, tmp_path):
    source, states = three_checkpoints
    directory = tmp_path / "checkpoints"
    shutil.copytree(source, directory)
    for step in (1, 2, 3):
        damage_files(directory / str(step), "delete")
    checkpointer = Checkpointer(directory, keep=None, create=False)
    with pytest.raises(CheckpointReadError, match="no checkpoint in .* can be restored"):
        checkpointer.restore_newest(jax.eval_shape(lambda: states[1]), tmp_path / "aside")
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2", "3"]  # nothing moved


def test_load_run_with_a_cut_run_json(run_dir, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(run_dir, workdir)
    (workdir / "run.json").write_text('{"model": "transf')
    with pytest.raises(ValueError, match="run.json"):
        load_run(workdir)


# ----------------------------------------------------------------------------- train.py workdirs
def test_a_cut_run_json_without_checkpoints_does_not_block_a_rerun(tmp_path, capsys):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "run.json").write_text('{"model": "seq2seq", "args": {"st')  # cut short
    (tmp_path / "bad.tsv").write_text("no tab here\n")
    code = train.main(["--train-tsv", str(tmp_path / "bad.tsv"), "--workdir", str(workdir)])
    err = capsys.readouterr().err
    # The run got past the workdir check (and stopped at its bad input, writing nothing).
    assert code == 2 and "is not readable JSON" in err and "line 1: no tab" in err
    assert sorted(p.name for p in workdir.iterdir()) == ["run.json"]


def test_resume_with_a_cut_run_json_uses_the_command_line(run_dir, tmp_path, capsys):
    workdir = tmp_path / "w"
    shutil.copytree(run_dir, workdir)
    (workdir / "run.json").write_text('{"model": "tra')
    args = train.parse_args(["--resume", "--workdir", str(workdir), "--steps", "7"])
    assert args.steps == 7 and args.resume
    assert "is not readable JSON; resuming with the flags of this command line" in (
        capsys.readouterr().err
    )


def test_a_failed_atomic_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half of the new con")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


# ----------------------------------------------------------------------------- file lists
def test_a_file_renamed_while_the_list_is_made_is_left_out(tmp_path, monkeypatch):
    """The two-process run that exited 1 once in six: process 1 listed the step directory while
    process 0's temporary list file was being renamed, and stat() of it failed."""
    from flax_transformer.training import checkpoint_files

    step_dir = tmp_path / "24"
    step_dir.mkdir()
    (step_dir / "kept").write_bytes(b"12345")
    real_walk = os.walk

    def walk_seeing_a_vanished_file(top):
        for root, dirs, names in real_walk(top):
            yield root, dirs, [*names, ".files.70a44f46.tmp.json"]  # renamed away meanwhile

    monkeypatch.setattr(checkpoint_files.os, "walk", walk_seeing_a_vanished_file)
    checkpoint_files.record_files(step_dir)
    assert json.loads((step_dir / checkpoint_files.FILE_LIST).read_text()) == {"kept": 5}


def test_only_process_0_writes_the_file_list(tmp_path, monkeypatch):
    from flax_transformer.training import checkpoint, checkpoint_files

    monkeypatch.setattr(checkpoint, "is_primary", lambda: False)  # process 1 of a run
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(directory, keep=None)
    checkpointer.save(tiny_state(1))
    checkpointer.close()
    assert (directory / "1").is_dir()
    assert not (directory / "1" / checkpoint_files.FILE_LIST).exists()


def test_open_run_says_in_one_line_why_a_command_cannot_use_a_workdir(run_dir, tmp_path):
    with pytest.raises(RunLoadError, match=r"--workdir .*nope is not a directory"):
        open_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunLoadError, match=r"cannot load run .*empty: .*config.json is missing"):
        open_run(tmp_path / "empty")
    with pytest.raises(RunLoadError, match="holds a seq2seq model; classify needs a model of kind"):
        open_run(run_dir, kinds=("encoder",), purpose="classify")
    assert open_run(run_dir, kinds=("seq2seq", "lm")).model_kind == "seq2seq"
