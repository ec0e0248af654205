"""The run directory under concurrency and interruption: one run at a time per --workdir (a lock
the OS drops when its holder dies), Ctrl-C / SIGTERM in one line with a resumable run and no
temporary checkpoint left, and a full disk in one line with the last checkpoint intact.

Two real processes where the behaviour needs them: a run held at a step by a hook (it waits
for a file the test writes) while a second command tries the same --workdir, and runs that the
test interrupts with a signal once a hook says they reached a step.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from flax_transformer.runs import run_dir
from flax_transformer.training import run_files

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "100",
    "--task-valid-size", "8", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--log-every", "1",
    "--dropout", "0", "--warmup", "2", "--steps", "10", "--save-every", "4",
    "--eval-every", "100",
]  # fmt: skip
# A run that, after step argv[1] (its checkpoints on disk), writes argv[2] and waits (at most
# two minutes) for argv[3] to exist: the test acts on the run while it is there.
HOLD_AT_STEP = """
import signal, sys, time
from pathlib import Path
import train

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell: pytest-xdist's
# workers ignore SIGINT, and a child inherits that

def hold(info):
    if info.event == "step" and info.step == int(sys.argv[1]):
        info.wait_for_checkpoints()
        Path(sys.argv[2]).write_text("there")
        deadline = time.time() + 120
        while not Path(sys.argv[3]).exists() and time.time() < deadline:
            time.sleep(0.05)

sys.exit(train.main(sys.argv[4:], hooks=[hold]))
"""


def start_held(tmp_path, workdir, step, *extra):
    """A training process held after `step`; (process, marker, release)."""
    marker, release = tmp_path / "reached", tmp_path / "release"
    cmd = [sys.executable, "-c", HOLD_AT_STEP, str(step), str(marker), str(release), *TINY,
           "--workdir", str(workdir), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    deadline = time.time() + 300
    while not marker.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the held run never reached step {step}: {err[-3000:]}")
        time.sleep(0.1)
    return proc, marker, release


def snapshot(workdir: Path) -> dict[str, bytes | None]:
    """Every file under workdir with its bytes (directories: None)."""
    return {
        str(p.relative_to(workdir)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(workdir.rglob("*"))
    }


def leftovers(workdir: Path) -> list[Path]:
    return [p for p in workdir.rglob("*") if "orbax-checkpoint-tmp" in p.name]


def checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


# ----------------------------------------------------------------------------- the lock
@pytest.mark.slow  # 24 s: two real training processes
def test_a_second_run_on_a_workdir_in_use_is_refused_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    first, _, release = start_held(tmp_path, workdir, 5)
    try:
        before = snapshot(workdir)
        second = subprocess.run(
            [sys.executable, "-m", "flax_transformer.train", *TINY, "--workdir", str(workdir),
             "--resume"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"error: --workdir {workdir} is in use by another run (pid {first.pid})"
        ]
        assert snapshot(workdir) == before  # the second wrote nothing
    finally:
        release.write_text("go")
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    # The first run finished undisturbed; its lock is gone with it.
    assert run_dir.read_results(workdir)["steps"] == 10
    run_dir.lock_run_dir(workdir).release()


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
    # A process that takes the lock and dies by SIGKILL: no cleanup of its own ran.
    code = (
        "import os, signal, sys\n"
        "from flax_transformer.runs import run_dir\n"
        "lock = run_dir.lock_run_dir(sys.argv[1])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / run_dir.LOCK).read_text().strip().isdigit()  # the file stays
    lock = run_dir.lock_run_dir(tmp_path)  # and does not block
    # Held now: another taker is refused, naming this process.
    with pytest.raises(run_dir.RunDirInUse, match=f"in use by another run \\(pid {os.getpid()}\\)"):
        run_dir.lock_run_dir(tmp_path)
    lock.release()
    run_dir.lock_run_dir(tmp_path).release()


# ----------------------------------------------------------------------------- signals
@pytest.mark.slow  # 15-34 s each: a run stopped by a real signal, then resumed
@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_stops_the_run_in_one_line_and_resume_continues(tmp_path, sig, status, capsys):
    workdir = tmp_path / "run"
    proc, _, _ = start_held(tmp_path, workdir, 6)  # held (never released) after step 6
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "interrupted at step 6: the last checkpoint is step 4; --resume continues"
    )
    assert checkpoint_steps(workdir) == [4]
    assert leftovers(workdir) == []
    assert not (workdir / run_dir.RESULTS).exists()
    if sig == signal.SIGTERM:
        return  # one resume is enough
    code = train.main([*TINY, "--workdir", str(workdir), "--resume"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "resumed from step 4" in out
    train_steps = [r["step"] for r in run_dir.read_metrics(workdir) if r["kind"] == "train"]
    assert train_steps == list(range(1, 11))


def test_unfinished_saves_are_removed(tmp_path):
    from flax_transformer.training.checkpoint import Checkpointer

    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.close()
    cut = tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp-1234"
    (cut / "params").mkdir(parents=True)
    (tmp_path / "checkpoints" / "4").mkdir()
    assert checkpointer.remove_unfinished() == [cut]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["4"]


# ----------------------------------------------------------------------------- disk full
def _full_disk_after(step: int, real):
    def append(path, record):
        if record["step"] >= step:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, record)

    return append


@pytest.mark.slow  # 8 s; a full disk stays fast in test_a_full_disk_while_writing_the_weights
def test_a_full_disk_stops_the_run_in_one_line_keeping_the_last_checkpoint(
    tmp_path, monkeypatch, capsys
):
    workdir = tmp_path / "run"
    monkeypatch.setattr(run_files, "append_metrics", _full_disk_after(6, run_files.append_metrics))
    code = train.main([*TINY, "--workdir", str(workdir)])
    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"error: the disk is full: cannot write {workdir / run_dir.METRICS}; stopping."
    )
    assert "the last good checkpoint is step 4" in lines[0]
    assert checkpoint_steps(workdir) == [4]
    assert leftovers(workdir) == []
    assert max(r["step"] for r in run_dir.read_metrics(workdir)) == 4


@pytest.mark.slow  # 7 s; a full disk stays fast in test_a_full_disk_while_writing_the_weights
def test_a_full_disk_while_saving_a_checkpoint(tmp_path, monkeypatch, capsys):
    import orbax.checkpoint as ocp

    real_save = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step >= 8:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    workdir = tmp_path / "run"
    code = train.main([*TINY, "--workdir", str(workdir)])
    out, err = capsys.readouterr()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    checkpoints = (workdir / run_dir.CHECKPOINTS).absolute()
    assert lines[0].startswith(f"error: the disk is full: cannot write {checkpoints / '8'}")
    assert checkpoint_steps(workdir) == [4]
    assert leftovers(workdir) == []


def test_a_metrics_line_cut_short_by_a_full_disk_reads_as_absent(tmp_path):
    path = tmp_path / run_dir.METRICS
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "tra')
    assert run_dir.read_metrics(path) == [{"kind": "train", "step": 1}]
    run_dir.truncate_metrics(path, 1)
    assert path.read_text() == '{"kind": "train", "step": 1}\n'
    path.write_text('{"kind": "tra\n{"kind": "train", "step": 1}\n')  # not at the end: an error
    with pytest.raises(ValueError):
        run_dir.read_metrics(path)


# ----------------------------------------------------------------------------- changed settings
SHORT = [*TINY, "--steps", "4", "--save-every", "2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("finished") / "run"
    assert train.main([*SHORT, "--workdir", str(workdir)]) == 0
    return workdir


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "16"], "--batch-size 16 differs from the run's 8"),
        (["--seed", "7"], "--seed 7 differs from the run's 0"),
        (["--task", "sort"], "--task sort differs from the run's reverse"),
        (["--lr", "0.5", "--seed", "3"], "--lr 0.5 differs from the run's 0.002; --seed 3"),
    ],
)
def test_resume_refuses_a_setting_that_changes_the_result(finished, capsys, flags, message):
    before = snapshot(finished)
    code = train.main([*SHORT, "--workdir", str(finished), "--resume", *flags])
    out, err = capsys.readouterr()
    assert code == 2
    (line,) = err.strip().splitlines()
    assert message in line
    assert "start a new --workdir to change" in line
    assert snapshot(finished) == before


@pytest.mark.slow  # 10 s: a resumed training run
def test_resume_records_compatible_settings_and_writes_no_duplicate_record(finished, capsys):
    saved = run_dir.read_run_json(finished)
    assert saved["resumed"] == []
    records = run_dir.read_metrics(finished)
    # A finished run evaluated again: the same records, no second final one.
    code = train.main([*SHORT, "--workdir", str(finished), "--resume"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "nothing to train" in out
    assert run_dir.read_metrics(finished) == records
    assert run_dir.read_run_json(finished) == saved  # nothing changed, nothing recorded
    # More steps and another save frequency: applied and recorded, the history kept.
    code = train.main([*SHORT, "--workdir", str(finished), "--resume", "--steps", "6",
                       "--save-every", "3"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    now = run_dir.read_run_json(finished)
    assert now["spec"]["training"]["steps"] == 6 and now["spec"]["training"]["save_every"] == 3
    assert now["resumed"] == [{"changed": {"save_every": [2, 3], "steps": [4, 6]}}]
    evals = [r["step"] for r in run_dir.read_metrics(finished) if r["kind"] == "eval"]
    assert evals == sorted(set(evals)) and evals[-1] == 6
    assert run_dir.read_results(finished)["steps"] == 6


def test_which_resume_settings_are_compared():
    from flax_transformer.runs.resume import changed_settings
    from flax_transformer.runs.spec import TrainSpec, UsageError

    saved = {"task": None, "steps": 4, "d_model": 16, "workdir": None, "mesh": None}
    now = TrainSpec(task="reverse", steps=4, d_model=32, workdir="runs/x", mesh="data=2",
                    pack=True)  # fmt: skip
    # The default task named, the model (checked against config.json), the workdir and a
    # setting the saved run does not know (pack): not changes. A new mesh: compatible, recorded.
    assert changed_settings(now, saved) == {"mesh": [None, "data=2"]}
    with pytest.raises(UsageError, match="--task copy differs from the run's reverse"):
        changed_settings(TrainSpec(task="copy", steps=4), saved)


def test_a_full_disk_while_writing_the_weights(tmp_path, monkeypatch, capsys):
    workdir = tmp_path / "run"

    def write_weights(directory, prefix, *args):
        path = run_dir.weight_paths(directory, prefix)["flax"]
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_files, "write_weights", write_weights)  # (the loop's own file)
    code = train.main([*TINY, "--steps", "4", "--workdir", str(workdir)])
    out, err = capsys.readouterr()
    assert code == 1
    (line,) = err.strip().splitlines()
    weights = workdir / run_dir.FLAX_WEIGHTS
    assert line.startswith(f"error: the disk is full: cannot write {weights}; stopping.")
    assert "the last good checkpoint is step 4" in line
    assert checkpoint_steps(workdir) == [4]
    assert not (workdir / run_dir.RESULTS).exists()


# ----------------------------------------------------------------------------- before a checkpoint
@pytest.mark.slow  # ~20 s; CI runs it (`-m slow`)
def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_0(tmp_path, capsys):
    """Found by the adversarial pass: Ctrl-C (or SIGKILL) before the first save left a run
    directory that blocked the same command again, and --resume said to delete it by hand."""
    workdir = tmp_path / "run"

    def stop_at_step_1(info):
        if info.event == "step" and info.step == 1:
            raise KeyboardInterrupt

    assert train.main([*SHORT, "--workdir", str(workdir)], hooks=[stop_at_step_1]) == 130
    _, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == (
        "interrupted at step 1: no checkpoint was saved yet; --resume starts the run over "
        "with its settings"
    )
    assert checkpoint_steps(workdir) == []
    assert train.main(["--workdir", str(workdir), "--resume"]) == 0
    out, _ = capsys.readouterr()
    assert "starting it over from step 0 with its settings" in out

    # The same run as one never stopped, record for record (all but the speed). (Not the
    # module's `finished` run: other tests resume it with more steps.)
    finished = tmp_path / "never_stopped"
    assert train.main([*SHORT, "--workdir", str(finished)]) == 0

    def records(directory):
        return [
            {k: v for k, v in r.items() if k != "tokens_per_sec"}
            for r in run_dir.read_metrics(directory)
        ]

    assert records(workdir) == records(finished)


# ----------------------------------------------------------------------------- before training
@pytest.mark.parametrize(
    "where, interruption, status",
    [
        ("flax_transformer.runs.train.join_processes", KeyboardInterrupt, 130),
        ("flax_transformer.training.loop.run_training", KeyboardInterrupt, 130),
        ("flax_transformer.training.loop.run_training", "terminated", 143),
    ],
)
def test_an_interruption_before_the_first_step_says_what_the_run_left(
    tmp_path, monkeypatch, capsys, where, interruption, status
):
    """runs.train says it (the workflow knows its workdir): before the run files, nothing to
    resume; once they are written (the loop not yet started), --resume starts the run over.
    SIGTERM (interrupts.Terminated) keeps its own exit status."""
    from flax_transformer.training.interrupts import Terminated

    error = Terminated() if interruption == "terminated" else interruption()

    def interrupt(*args, **kwargs):
        raise error

    monkeypatch.setattr(where, interrupt)
    workdir = tmp_path / "run"
    assert train.main([*SHORT, "--workdir", str(workdir)]) == status
    _, err = capsys.readouterr()
    line = err.strip().splitlines()[-1]
    if where.endswith("join_processes"):
        assert line == "interrupted before training started"
        assert not workdir.exists()
    else:
        assert line == (
            f"interrupted before training started; --resume --workdir {workdir} continues it "
            "(from step 0 if it saved no checkpoint)"
        )
        assert (workdir / run_dir.RUN_JSON).exists()
