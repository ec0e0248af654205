"""The commands as a user meets them: the installed `ftx` and its subcommands, every `--help`
(works, prints usage, does nothing else), one exit-status rule (0 ok, 1 a failed check, 2 bad
input or usage) and one spelling of the run directory (`--workdir RUN`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer.cli.main import COMMANDS
from flax_transformer.cli.main import main as ftx

ROOT = Path(__file__).resolve().parents[1]


def has_train_module() -> bool:
    """flax_transformer.cli.train arrives with the training CLI's move into the package."""
    return importlib.util.find_spec("flax_transformer.cli.train") is not None


def subcommands() -> list:
    skip = pytest.mark.skip(reason="flax_transformer.cli.train does not exist yet")
    return [
        pytest.param(name, marks=() if name != "train" or has_train_module() else skip, id=name)
        for name in COMMANDS
    ]


def run_ftx(argv, capsys):
    code = ftx(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ftx_help_lists_every_command_with_one_line(capsys):
    code, out, _ = run_ftx(["--help"], capsys)
    assert code == 0 and out.startswith("usage: ftx")
    for name, (_, line) in COMMANDS.items():
        assert f"  {name}" in out and line in out
    assert set(COMMANDS) == {
        "train", "generate", "classify", "score", "convert", "parity", "export", "hf", "launch",
        "demo", "info", "kernels",
    }  # fmt: skip


def test_ftx_version_is_the_package_version(capsys):
    import flax_transformer

    code, out, _ = run_ftx(["--version"], capsys)
    assert code == 0 and out.strip() == f"ftx (flax-transformer) {flax_transformer.__version__}"


@pytest.mark.parametrize("argv", [["nope"], ["--nope"], []], ids=["word", "flag", "nothing"])
def test_ftx_unknown_or_missing_command_exits_2_naming_the_commands(argv, capsys):
    code, out, err = run_ftx(argv, capsys)
    assert code == 2 and out == ""
    assert ", ".join(COMMANDS) in err
    if argv:
        assert f"unknown command {argv[0]!r}" in err


@pytest.mark.parametrize("name", subcommands())
def test_ftx_subcommand_help_prints_usage_and_does_nothing_else(
    name, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_ftx([name, "--help"], capsys)
    assert code == 0, err
    assert out.startswith(f"usage: ftx {name} ") and err == ""  # the command as users type it
    assert "python -m" not in out and "python train.py" not in out
    assert list(tmp_path.iterdir()) == []  # no file, no run directory made


# The commands whose result is one record: readable lines by default, --json for machines
# (cli/output.py). train, generate, classify and launch stream their output and do not yet.
JSON_COMMANDS = [["convert"], ["hf", "import"], ["hf", "export"], ["export"], ["score"],
                 ["parity"], ["info"], ["kernels", "build"], ["demo"]]  # fmt: skip


@pytest.mark.parametrize("argv", JSON_COMMANDS, ids=" ".join)
def test_commands_with_one_result_take_json(argv, capsys):
    code, out, _ = run_ftx([*argv, "--help"], capsys)
    assert code == 0 and "--json [OUT]" in out


def test_json_is_the_result_and_the_lines_are_for_a_person(tmp_path, capsys):
    from flax_transformer.cli.output import emit

    result = {"command": "export", "output": "x"}
    emit(result, ["exported x"], None)
    assert capsys.readouterr().out == "exported x\n"
    emit(result, ["exported x"], "-")
    assert json.loads(capsys.readouterr().out) == result
    emit(result, ["exported x"], str(tmp_path / "r.json"))
    assert capsys.readouterr().out == "exported x\n"
    assert json.loads((tmp_path / "r.json").read_text()) == result


def test_ftx_dispatches_to_the_commands_main(monkeypatch):
    """`ftx X ARGS` is X's main(ARGS): same function, same arguments, its status returned."""
    import flax_transformer.cli.launch as launch

    seen = []
    monkeypatch.setattr(launch, "main", lambda argv: seen.append(argv) or 7)
    assert ftx(["launch", "--processes", "2", "--", "x.py"]) == 7
    assert seen == [["--processes", "2", "--", "x.py"]]


# ----------------------------------------------------------------------------- python -m X --help
MODULES = ["convert", "generate", "parity", "export", "hf", "launch", "demo", "interop", "cli"]


def test_every_module_entry_point_help_works_and_does_nothing_else(tmp_path):
    """`python -m flax_transformer.X --help` for every entry point, in fresh processes run
    side by side: exit 0, usage on stdout, nothing on stderr, no file created. (launch's --help
    used to fail for want of `--`; demo's ran the demo.)"""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"flax_transformer.{name}", "--help"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in MODULES
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name}: {err}"
        assert out.startswith("usage:"), f"{name}: {out[:200]}"
        assert "Traceback" not in err and "error" not in err.lower(), f"{name}: {err}"
        assert "float64: logits" not in out  # the demo did not run
    assert list(tmp_path.iterdir()) == []


def test_demo_takes_no_positional_arguments(capsys):
    from flax_transformer.cli.demo import main as demo

    with pytest.raises(SystemExit) as done:
        demo(["now"])
    assert done.value.code == 2 and "unrecognized arguments: now" in capsys.readouterr().err


def test_launch_without_a_command_is_still_a_usage_error(capsys):
    from flax_transformer.cli.launch import parse_args

    with pytest.raises(SystemExit) as done:
        parse_args(["--processes", "2"])
    assert done.value.code == 2 and "give the command after --" in capsys.readouterr().err


# ----------------------------------------------------------------------------- exit status 2
BAD_INPUT = [
    # (ftx argv, with {tmp} for the test's directory; what the message must name)
    (["generate", "--workdir", "{tmp}/nope"], "--workdir {tmp}/nope is not a directory"),
    (["generate", "--workdir", "{tmp}", "--top-p", "2"], "argument --top-p"),
    (["convert", "{tmp}/nope.safetensors", "{tmp}/out.safetensors"], "{tmp}/nope.safetensors"),
    (["convert", "{tmp}/a.safetensors"], "give the output file once"),
    (["parity", "{tmp}/a.safetensors", "{tmp}/b.safetensors"], "{tmp}/a.safetensors: no such"),
    (["parity", "--workdir", "{tmp}", "b", "c"], "give at most one positional"),
    (
        ["export", "--workdir", "{tmp}/nope", "--format", "onnx", "--out", "{tmp}/o"],
        "--workdir {tmp}/nope is not a directory",
    ),
    (["export", "--format", "onnx", "--out", "{tmp}/o"], "give the run directory: --workdir"),
    (
        ["export", "{tmp}", "--workdir", "{tmp}/x", "--format", "onnx", "--out", "{tmp}/o"],
        "two run",
    ),
    (["hf", "import", "opus-mt-en-de", "--workdir", "{tmp}/run"], "Hub ids are not downloaded"),
    (["hf", "export", "--workdir", "{tmp}", "--out", "{tmp}/../o"], "no hf_config.json"),
    (
        ["hf", "export", "--workdir", "{tmp}", "--out", "{tmp}/o"],
        "--out {tmp}/o lies inside the run directory {tmp}",
    ),
    (["hf", "export", "--workdir", "{tmp}"], "export needs --workdir RUN and --out HF_DIR"),
    (["launch", "--processes", "0", "--", "x.py"], "--processes must be >= 1, got 0"),
    (["launch", "--processes", "2"], "give the command after --"),
    (["demo", "--seed", "-1"], "--seed must be >= 0, got -1"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_INPUT, ids=[" ".join(a[:2]) for a, _ in BAD_INPUT]
)
def test_bad_input_exits_2_naming_the_problem(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run_ftx(argv, capsys)
    assert code == 2, (out, err)
    assert message.format(tmp=tmp_path) in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no run made


def test_interop_bad_settings_exit_2(capsys):
    from flax_transformer.cli.nn_transformer_check import main as interop

    assert interop(["--d-model", "30", "--nhead", "4", "--num-encoder-layers", "1"]) == 2
    assert "invalid nn.Transformer settings" in capsys.readouterr().err


def test_generate_unreadable_input_exits_2(tmp_path, capsys):
    from flax_transformer.cli.generate import read_lines

    with pytest.raises(SystemExit) as done:
        read_lines(tmp_path / "missing.txt")
    assert done.value.code == 2
    assert f"cannot read --input {tmp_path / 'missing.txt'}" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --workdir everywhere
def test_every_run_reading_command_takes_workdir(tmp_path):
    """The same flag for the run directory in every command; the old positional spelling gives
    the same arguments."""
    from flax_transformer.cli.export import parse_args as export_args
    from flax_transformer.cli.generate import parse_args as generate_args
    from flax_transformer.cli.hf import parse_args as hf_args
    from flax_transformer.cli.parity import parse_args as parity_args

    (tmp_path / "run").mkdir()  # the output beside the run, not inside it (that is refused)
    run, out = str(tmp_path / "run"), str(tmp_path / "out")
    assert str(generate_args(["--workdir", run]).workdir) == run
    new = export_args(["--workdir", run, "--format", "onnx", "--out", out])
    old = export_args([run, "--format", "onnx", "--output", out])
    assert str(new.run_dir) == str(old.run_dir) == run and new.out == old.out
    new, old = hf_args(["export", "--workdir", run, "--out", out]), hf_args(["export", run, out])
    assert (new.run_dir, new.hf_dir) == (old.run_dir, old.hf_dir) == (run, out)
    new = hf_args(["import", "hf", "--workdir", run])
    assert (new.hf_dir, new.run_dir) == ("hf", run) == (hf_args(["import", "hf", run]).hf_dir, run)
    assert (parity_args(["--workdir", run]).a, parity_args(["--workdir", run]).b) == (run, run)
    assert (parity_args(["--workdir", run, "b"]).a, parity_args(["--workdir", run, "b"]).b) == (
        run,
        "b",
    )
    assert (parity_args([run, "b"]).a, parity_args([run, "b"]).b) == (run, "b")


def test_train_takes_workdir():
    train = pytest.importorskip("flax_transformer.cli.train")
    assert "--workdir" in train.build_parser().format_help()


@pytest.mark.slow  # 5 s: builds and compares a run; --workdir of parity is also in the table test
def test_parity_of_a_run_against_itself_with_workdir(tmp_path, capsys):
    """`ftx parity --workdir RUN`: the run's weights in Flax against the same weights in the
    torch twin, float64: they agree (exit 0)."""
    from .export_runs import fabricate_run

    run = fabricate_run(tmp_path / "run", "seq2seq")
    code, out, err = run_ftx(["parity", "--workdir", str(run)], capsys)
    assert code == 0, err
    assert "within tolerance" in out or "ok" in out.lower()
