"""train.py end to end when its checkpoints go bad (slow: two tiny trained runs, in-process).

1. The checkpoint directory stops taking files mid-run: the run stops with one message, keeps
   its last good checkpoint, and cuts metrics.jsonl back to it.
2. That run is resumed after its newest checkpoint lost files and its run.json was cut short:
   the resume skips the damaged checkpoint (named, moved aside, not deleted), continues from
   the one before and finishes.
"""

from __future__ import annotations

import json
import shutil

import pytest

import train

from .test_bad_input_runs import damage_files, make_unwritable, make_writable

pytestmark = pytest.mark.slow

TINY = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "100",
    "--task-valid-size", "8", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--log-every", "1",
    "--dropout", "0", "--warmup", "2", "--steps", "8", "--save-every", "2",
    "--eval-every", "100",
]  # fmt: skip


def records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def checkpoint_steps(directory):
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run whose checkpoints/ becomes unwritable after step 5: (workdir, code, stderr)."""
    workdir = tmp_path_factory.mktemp("bad_training") / "run"
    blocked = []

    def block_checkpoints(info):
        if info.event == "step" and info.step == 5:
            info.wait_for_checkpoints()
            blocked.append(make_unwritable(info.workdir / "checkpoints"))

    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = train.main([*TINY, "--workdir", str(workdir)], hooks=[block_checkpoints])
    finally:
        make_writable(workdir / "checkpoints")
    if blocked != [True]:
        pytest.skip("cannot make a directory unwritable here (chattr refused)")
    return workdir, code, err.getvalue()


def test_an_unwritable_checkpoint_directory_stops_the_run_cleanly(stopped_run):
    workdir, code, err = stopped_run
    messages = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(messages) == 1, err
    assert "Traceback" not in err and "orbax" not in err.lower()
    assert messages[0].startswith(f"error: cannot write checkpoint step 6 into {workdir}")
    assert "the last good checkpoint is step 4" in messages[0]
    assert "metrics.jsonl now ends at step 4" in messages[0]
    assert checkpoint_steps(workdir / "checkpoints") == [2, 4]
    assert [r["step"] for r in records(workdir)] == [1, 2, 3, 4]


def test_resume_skips_a_damaged_checkpoint_and_deletes_nothing(stopped_run, capsys):
    workdir, _, _ = stopped_run
    damage_files(workdir / "checkpoints" / "4", "delete")
    text = (workdir / "run.json").read_text()
    (workdir / "run.json").write_text(text[: len(text) // 2])  # cut short, as by a crash
    code = train.main([*TINY, "--resume", "--workdir", str(workdir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "run.json is not readable JSON; resuming with the flags of this command line" in err
    assert "checkpoint step 4 in" in err and "is missing (deleted?)" in err
    assert "moved, not deleted, to" in err and "Traceback" not in err
    assert "resumed from step 2" in out
    assert (workdir / "checkpoints_unrestorable" / "4" / "params").is_dir()
    assert checkpoint_steps(workdir / "checkpoints") == [4, 6, 8]
    steps = [r["step"] for r in records(workdir) if r["kind"] == "train"]
    assert steps == list(range(1, 9))  # the metrics continue from the checkpoint, no repeats
    assert (
        json.loads((workdir / "run.json").read_text())["spec"]["training"]["steps"] == 8
    )  # rewritten
    assert json.loads((workdir / "results.json").read_text())["steps"] == 8
    shutil.rmtree(workdir)
