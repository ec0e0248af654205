"""One rule for every command that writes (issue 24, "an output path that is an input"): an output
that is, contains or lies inside one of the command's inputs is refused with exit status 2 and a
line naming both paths, before anything is read or written: every input keeps its bytes and
nothing is left behind. --force never changes that; it only lets a non-empty output directory be
replaced (whole: a staged directory renamed at the end).

The table tries each command that writes against each of its inputs as output, the input's own
directory as output, and a path inside the input. The checks come before any input is read, so
the inputs here are tiny stand-ins (a run directory without a checkpoint, a few bytes of
"weights"); the --force cases at the end export a real (tiny, random) imported Marian run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer.cli.convert import main as convert_main
from flax_transformer.cli.export import main as export_main
from flax_transformer.cli.hf import main as hf_main
from flax_transformer.cli.parity import main as parity_main
from flax_transformer.cli.train import main as train_main
from flax_transformer.files.atomic_io import OutputPathError, check_not_input, check_output_dir

from . import hf_models
from .export_runs import fabricate_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Every input of the table, each alone in its own folder (so that "the folder holding the
    input" holds nothing else the command reads)."""
    root = tmp_path_factory.mktemp("inputs")

    def file(name: str, data: bytes) -> Path:
        (root / name).mkdir()
        (root / name / name).write_bytes(data)
        return root / name / name

    (root / "hf" / "hf").mkdir(parents=True)  # a save_pretrained directory (read after the check)
    (root / "hf" / "hf" / "config.json").write_text('{"model_type": "marian"}')
    return {
        "weights_a": file("a.safetensors", b"weights A, read only after the output is checked"),
        "weights_b": file("b.safetensors", b"weights B"),
        "config": file("config.json", b'{"d_model": 32}'),
        "tokenizer": file("tokenizer.json", b'{"kind": "byte"}'),
        "train_tsv": file("train.tsv", b"a b\tb a\n"),
        "valid_tsv": file("valid.tsv", b"c d\td c\n"),
        "lm_text": file("lm.txt", b"some text\n"),
        "lm_valid": file("lm_valid.txt", b"more text\n"),
        "run": fabricate_run(root / "run" / "run", "seq2seq", checkpoint=False),
        "hf_dir": root / "hf" / "hf",
    }


# (id, the command's main, argv given the inputs and the output, which input is the output)
def _convert(i, out):
    return ["convert", convert_main, [str(i["weights_a"]), "--out", str(out),
                                      "--config", str(i["config"])]]  # fmt: skip


def _parity(i, out):
    return ["parity", parity_main, [str(i["weights_a"]), str(i["run"]), "--json", str(out),
                                    "--config", str(i["config"]),
                                    "--tokenizer", str(i["tokenizer"])]]  # fmt: skip


def _export(i, out):
    return ["export", export_main, ["--workdir", str(i["run"]), "--format", "stablehlo",
                                    "--out", str(out), "--force"]]  # fmt: skip


def _hf_import(i, out):
    return ["hf import", hf_main, ["import", str(i["hf_dir"]), "--workdir", str(out)]]


def _hf_export(i, out):
    return ["hf export", hf_main, ["export", "--workdir", str(i["run"]), "--out", str(out),
                                   "--force"]]  # fmt: skip


def _train_tsv(i, out):
    return ["train", train_main, ["--train-tsv", str(i["train_tsv"]), "--valid-tsv",
                                  str(i["valid_tsv"]), "--workdir", str(out)]]  # fmt: skip


def _train_lm(i, out):
    return ["train", train_main, ["--lm-text", str(i["lm_text"]), "--lm-valid",
                                  str(i["lm_valid"]), "--workdir", str(out)]]  # fmt: skip


def _train_init(i, out):
    return ["train", train_main, ["--init-from", str(i["run"]), "--train-tsv",
                                  str(i["train_tsv"]), "--workdir", str(out)]]  # fmt: skip


COMMANDS = [
    (_convert, ("weights_a", "config")),
    (_parity, ("weights_a", "run", "config", "tokenizer")),
    (_export, ("run",)),
    (_hf_import, ("hf_dir",)),
    (_hf_export, ("run",)),
    (_train_tsv, ("train_tsv", "valid_tsv")),
    (_train_lm, ("lm_text", "lm_valid")),
    (_train_init, ("run", "train_tsv")),
]
RELATIONS = {  # the output, given the input
    "is": lambda path: path,
    "contains": lambda path: path.parent,
    "lies inside": lambda path: path / "out",
}
CASES = [
    (build, name, relation) for build, names in COMMANDS for name in names for relation in RELATIONS
]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: its relative path and a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "/"
        for p in sorted(root.rglob("*"))
    }


def exit_status(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as exit:  # argparse's error
        return exit.code


@pytest.mark.parametrize(
    ("build", "name", "relation"),
    CASES,
    ids=[f"{b.__name__[1:]}-{n}-{r.replace(' ', '_')}" for b, n, r in CASES],
)
def test_an_output_that_is_contains_or_lies_inside_an_input_is_refused(
    inputs, build, name, relation, capsys
):
    root = inputs["run"].parents[1]
    before = snapshot(root)
    out = RELATIONS[relation](inputs[name])
    command, main, argv = build(inputs, out)
    assert exit_status(main, argv) == 2, command
    err = capsys.readouterr().err
    assert f"{out} {relation} the " in err and str(inputs[name]) in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err
    assert snapshot(root) == before  # the input's bytes unchanged, nothing left behind


def test_symlinks_and_dotdot_are_resolved(inputs, tmp_path, capsys):
    root = inputs["run"].parents[1]
    before = snapshot(root)
    link = tmp_path / "link.json"
    link.symlink_to(inputs["weights_b"])
    a, b = str(inputs["weights_a"]), str(inputs["weights_b"])
    assert exit_status(parity_main, [a, b, "--json", str(link)]) == 2
    assert f"--json {link} is the input B {b}" in capsys.readouterr().err
    run_link = tmp_path / "run_link"
    run_link.symlink_to(inputs["run"], target_is_directory=True)
    dotdot = run_link / "checkpoints" / ".." / "hf"  # inside the run, through a link and ..
    assert hf_main(["export", "--workdir", str(inputs["run"]), "--out", str(dotdot)]) == 2
    assert f"--out {dotdot} lies inside the run directory {inputs['run']}" in (
        capsys.readouterr().err
    )
    assert snapshot(root) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "link.json",
        "run_link",
    ]


def test_a_hard_link_is_the_same_file(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x")
    os.link(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    with pytest.raises(OutputPathError, match=r"b\.safetensors is the input A .*a\.safetensors"):
        check_not_input(tmp_path / "b.safetensors", [("input A", tmp_path / "a.safetensors")])
    check_not_input(tmp_path / "c.safetensors", [tmp_path / "a.safetensors"])  # not an input
    assert (tmp_path / "b.safetensors").read_bytes() == b"x"


def test_force_never_deletes_an_input(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.tsv").write_text("a\tb\n")
    for out in (tmp_path, tmp_path / "data", tmp_path / "data" / "x.tsv"):
        with pytest.raises(OutputPathError, match="the input"):
            check_output_dir(out, inputs=[tmp_path / "data" / "x.tsv"], force=True)
    check_output_dir(tmp_path / "new", inputs=[tmp_path / "data" / "x.tsv"], force=True)
    check_output_dir(tmp_path / "data", force=True)  # no inputs: --force may replace it


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("parity", ["{a}", "{b}", "--json", "{a}"]),
        ("hf", ["export", "{run}", "{run}"]),
    ],
)
def test_installed_commands_refuse_too(inputs, module, argv):
    """The command line itself (a subprocess): exit 2, one line naming both paths."""
    root = inputs["run"].parents[1]
    before = snapshot(root)
    paths = {"a": inputs["weights_a"], "b": inputs["weights_b"], "run": inputs["run"]}
    argv = [arg.format(**paths) for arg in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", f"flax_transformer.{module}", *argv],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{argv[-1]} is the input" in done.stderr or f"{argv[-1]} is the run" in done.stderr
    assert snapshot(root) == before


# ----------------------------------------------------------------------- non-empty outputs
@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A run imported from a tiny random Marian directory (with a tokenizer)."""
    root = tmp_path_factory.mktemp("imported")
    hf_dir = hf_models.save(hf_models.build("marian", seed=2), root / "hf", tokenizer=True)
    assert hf_main(["import", str(hf_dir), "--workdir", str(root / "run")]) == 0
    return root / "run"


def test_hf_export_into_a_non_empty_directory_needs_force(imported, tmp_path, capsys):
    out = tmp_path / "hf_out"
    out.mkdir()
    (out / "old_weights.bin").write_bytes(b"from another model")
    argv = ["export", "--workdir", str(imported), "--out", str(out)]
    assert hf_main(argv) == 2
    assert f"--out {out} exists and is not empty (--force replaces it)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["old_weights.bin"]
    assert hf_main([*argv, "--force", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["command"], result["output"], result["model"]["family"]) == (
        "export", str(out), "marian"
    )  # fmt: skip
    names = sorted(p.name for p in out.iterdir())
    assert "old_weights.bin" not in names  # replaced whole, not mixed with the old files
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf_out"]  # no staging left


def test_a_failed_hf_export_with_force_keeps_the_old_directory(
    imported, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "hf_out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    def full_disk(model, path, max_shard_size=None):
        (Path(path) / "config.json").write_text("{half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("flax_transformer.runs.hf_convert.save", full_disk)
    argv = ["export", "--workdir", str(imported), "--out", str(out), "--force"]
    assert hf_main(argv) == 1  # a failed write, not bad input
    err = capsys.readouterr().err
    assert err == "error: the disk is full: cannot write a file; nothing half-written was kept\n"
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf_out"]


def test_hf_import_into_a_non_empty_directory_is_refused(imported, tmp_path, capsys):
    hf_dir = imported.parent / "hf"
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert hf_main(["import", str(hf_dir), "--workdir", str(out)]) == 2
    assert "is not an empty directory; nothing was written" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
