"""A run directory written by 0.2.0 (tests/fixtures/run_v020, its README says how it was made)
still resumes, generates, scores and exports: its run.json is the old form (the flags as
`"args"`, no schema key), which runs/spec.py translates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flax_transformer.cli import export, generate, score, train
from flax_transformer.cli.train_flags import parse_args, spec_from_args
from flax_transformer.runs import run_dir
from flax_transformer.runs.spec import TrainSpec, spec_record, spec_values

FIXTURE = Path(__file__).parent / "fixtures" / "run_v020"


@pytest.fixture
def old_run(tmp_path, monkeypatch):
    """A copy of the 0.2.0 run (its run.json names train.tsv and the workdir relatively, as the
    command that made it was run from the folder that holds both)."""
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "run"


def test_the_fixture_is_the_old_form():
    saved = json.loads((FIXTURE / "run" / run_dir.RUN_JSON).read_text())
    assert "schema" not in saved and isinstance(saved["args"], dict)


def test_the_old_run_json_reads_as_the_spec(old_run):
    saved = run_dir.read_run_json(old_run)
    values = spec_values(saved)
    assert values == saved["args"]  # 0.2's flags are today's spec fields
    spec = spec_from_args(parse_args(["--resume", "--workdir", str(old_run)]))
    assert (spec.train_tsv, spec.d_model, spec.steps) == ("train.tsv", 8, 2)
    # A spec written today reads back the same way, from its groups.
    record = {"schema": run_dir.RUN_JSON_SCHEMA, "spec": spec_record(spec)}
    assert TrainSpec(**spec_values(record), resume=True) == spec.replace(run_config=None)


def test_a_newer_schema_is_refused_by_name(tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", workdir)
    saved = json.loads((workdir / run_dir.RUN_JSON).read_text())
    newer = {"schema": run_dir.RUN_JSON_SCHEMA + 1, "model": saved["model"], "spec": {}}
    (workdir / run_dir.RUN_JSON).write_text(json.dumps(newer))
    assert train.main(["--resume", "--workdir", str(workdir)]) == 2
    assert "schema 3 is newer than this version reads" in capsys.readouterr().err


@pytest.mark.slow
def test_the_old_run_resumes_generates_scores_and_exports(old_run, tmp_path, capsys):
    assert train.main(["--resume", "--workdir", "run", "--steps", "4"]) == 0
    assert run_dir.read_results(old_run)["steps"] == 4
    steps = [r["step"] for r in run_dir.read_metrics(old_run) if r["kind"] == "train"]
    assert steps[-1] == 4
    # The resume changed --steps: run.json is written anew in today's schema.
    rewritten = run_dir.read_run_json(old_run)
    assert rewritten["schema"] == run_dir.RUN_JSON_SCHEMA
    assert rewritten["resumed"] == [{"changed": {"steps": [2, 4]}}]
    capsys.readouterr()

    (tmp_path / "in.txt").write_text("abc\nhello\n")
    assert generate.main(["--workdir", "run", "--input", "in.txt"]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # one line an input (an untrained model's)

    assert score.main(["--workdir", "run", "--test-tsv", "train.tsv", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["examples"] == 8 and scores["bleu_tokenize"] == "13a"  # auto, a corpus

    out = tmp_path / "exported"
    assert export.main(["--workdir", "run", "--format", "stablehlo", "--out", str(out)]) == 0
    assert any(out.iterdir())
