"""Bad input to `python -m flax_transformer.export`: each case gets a clear error (argparse's
exit 2 for flags, exit 2 with the reason for a run that cannot be exported) and leaves nothing
behind: no --out, no temporary directory beside it, an existing --out untouched."""

from __future__ import annotations

import pytest

from flax_transformer.cli.export import main
from flax_transformer.export.output import ExportError, staged_output
from tests.export_runs import CONFIG, fabricate_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "seq2seq": fabricate_run(root / "seq2seq", "seq2seq"),
        "no_checkpoint": fabricate_run(root / "empty", "seq2seq", checkpoint=False),
        "mixed": fabricate_run(root / "mixed", "lm", CONFIG.replace(dtype="bfloat16")),
    }


def leftovers(parent) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def flag_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_unknown_format(runs, tmp_path, capsys):
    err = flag_error(
        [str(runs["seq2seq"]), "--format", "tflite", "--out", str(tmp_path / "o")], capsys
    )
    assert "argument --format: invalid choice: 'tflite'" in err
    assert not (tmp_path / "o").exists()


def test_output_dir_not_empty_is_refused_without_force(runs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = flag_error([str(runs["seq2seq"]), "--format", "stablehlo", "--out", str(out)], capsys)
    assert f"--out {out} exists and is not empty (--force replaces it)" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("")
    err = flag_error(
        [str(runs["seq2seq"]), "--format", "onnx", "--out", str(tmp_path / "file")], capsys
    )
    assert "exists and is not a directory" in err


def test_flags_that_do_not_apply(runs, tmp_path, capsys):
    base = [str(runs["seq2seq"]), "--out", str(tmp_path / "o")]
    assert "--int8 applies to --format stablehlo" in flag_error(
        [*base, "--format", "onnx", "--int8"], capsys
    )
    err = flag_error([*base, "--format", "torch-int8", "--max-new-tokens", "3"], capsys)
    assert "--max-new-tokens applies to --format stablehlo" in err
    err = flag_error([*base, "--format", "stablehlo", "--platforms", "cpu,gpu"], capsys)
    assert "--platforms must name some of cpu, cuda, rocm, tpu, got ['gpu']" in err
    err = flag_error(
        [str(tmp_path / "nope"), "--format", "onnx", "--out", str(tmp_path / "o")], capsys
    )
    assert "is not a directory" in err


def test_run_without_checkpoint(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(runs["no_checkpoint"]), "--format", "stablehlo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot load run {runs['no_checkpoint']}" in err and "no checkpoint found" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_option_the_exporter_cannot_express(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(runs["mixed"]), "--format", "onnx", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--format onnx writes float32 graphs, but this run has dtype 'bfloat16'" in err
    assert "config.json" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_failed_export_leaves_nothing_half_written(runs, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(runs["seq2seq"]), "--format", "stablehlo", "--out", str(out)]
    assert main([*argv, "--max-new-tokens", "99"]) == 2
    assert "--max-new-tokens 99 must be 1..max_len (24)" in capsys.readouterr().err
    assert not out.exists() and leftovers(tmp_path) == []


def test_staged_output_replaces_only_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(ExportError, match="exists and is not empty"):
        with staged_output(out, force=False):
            pass
    with pytest.raises(RuntimeError, match="boom"):
        with staged_output(out, force=True) as staging:
            (staging / "half.bin").write_bytes(b"x")
            raise RuntimeError("boom")
    assert [p.name for p in out.iterdir()] == ["old.txt"] and leftovers(tmp_path) == []
    with staged_output(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"] and leftovers(tmp_path) == []


def test_missing_onnx_exporter_says_what_to_install(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnxscript", None)  # import fails
    assert main([str(runs["seq2seq"]), "--format", "onnx", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--format onnx needs onnxscript: pip install 'flax-transformer[export]'" in err
    assert leftovers(tmp_path) == []
