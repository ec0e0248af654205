"""Writes cut short (issue 24, "interrupted writes"), on the command-line surface: a real
file-size limit (`ulimit -f`, the way to fill a disk without filling one) and real signals
in the middle of `hf import`, `hf export --force`, `convert` and a training run. Each ends in one
line with its exit status (1 out of space, 130 Ctrl-C, 143 SIGTERM), leaves no half-written
file or directory, keeps what was there before byte for byte, and a retry succeeds."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flax_transformer.cli.hf import main as hf_main
from flax_transformer.files.atomic_io import staged_directory
from flax_transformer.interop.convert import save_torch_state

from . import hf_models
from .test_parity_report import CONFIG
from .test_parity_report_cli import torch_state

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 20_000  # above every config / tokenizer file, below the weights (about 100 kB)


# Runs `python ARGS...` under a file-size limit: the limit is set in a first Python that then
# becomes the command (exec), so that no fork of this multithreaded test process runs Python.
LIMITED = (
    "import os, resource, sys; limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def run(argv, *, limit: int | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    """`python ARGV` in `cwd`; with `limit`, no file it writes may pass `limit` bytes (EFBIG
    beyond: Python ignores SIGXFSZ)."""
    prefix = [] if limit is None else ["-c", LIMITED, str(limit)]
    return subprocess.run(
        [sys.executable, *prefix, *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command (no traceback, nothing else)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def tree_digest(path: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `path`."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def leftovers(folder: Path) -> list[str]:
    """Hidden staging / temporary entries in `folder` (what a half-done write would leave)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("interrupted")
    return hf_models.save(hf_models.build("marian", seed=2), root / "hf", tokenizer=True)


@pytest.mark.slow  # ~19 s on 2 cores; the signal cases below stay in the fast suite
def test_hf_import_past_a_file_size_limit_leaves_nothing_and_a_retry_works(hf_dir, tmp_path):
    before = tree_digest(hf_dir)
    workdir = tmp_path / "run"
    result = run(
        ["-m", "flax_transformer.hf", "import", hf_dir, "--workdir", workdir], limit=LIMIT_BYTES
    )
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith("error: the file-size limit (ulimit -f) stopped the write of ")
    assert line.endswith("nothing half-written was kept")
    assert not workdir.exists() and leftovers(tmp_path) == []
    assert tree_digest(hf_dir) == before
    retry = run(["-m", "flax_transformer.hf", "import", hf_dir, "--workdir", workdir])
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert retry.stdout.startswith("imported a marian model (seq2seq: ")
    assert retry.stdout.rstrip().endswith(f"into the run {workdir}")


@pytest.mark.slow  # 8 s; the same staging is tested fast by the import above
def test_hf_export_force_past_a_file_size_limit_keeps_the_old_export(hf_dir, tmp_path):
    workdir, out = tmp_path / "run", tmp_path / "export"
    assert hf_main(["import", str(hf_dir), "--workdir", str(workdir)]) == 0
    assert hf_main(["export", "--workdir", str(workdir), "--out", str(out)]) == 0
    old_export, old_run = tree_digest(out), tree_digest(workdir)
    argv = ["-m", "flax_transformer.hf", "export", "--workdir", workdir, "--out", out, "--force"]
    result = run(argv, limit=LIMIT_BYTES)
    assert result.returncode == 1
    assert "stopped the write of" in one_line(result)
    assert tree_digest(out) == old_export and tree_digest(workdir) == old_run
    assert leftovers(tmp_path) == []


def test_convert_past_a_file_size_limit_leaves_no_output(tmp_path):
    source = tmp_path / "torch.safetensors"
    save_torch_state(source, torch_state(), CONFIG)
    out = tmp_path / "flax.safetensors"
    result = run(["-m", "flax_transformer.convert", source, "--out", out], limit=LIMIT_BYTES)
    assert result.returncode == 1
    assert one_line(result) == (  # the output named (safetensors' own error names no file)
        f"error: the file-size limit (ulimit -f) stopped the write of {out}; "
        "nothing half-written was kept"
    )
    assert not out.exists() and leftovers(tmp_path) == []


# A real signal in the middle of a write: the command runs with its writer wrapped so that the
# process signals itself once the first part of the output exists.
SIGNAL_MID_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (pytest-xdist's
# workers ignore SIGINT, and a child inherits that)
from flax_transformer.training import checkpoint
save = checkpoint.Checkpointer.save
def save_then_signal(self, *args, **kwargs):
    step = save(self, *args, **kwargs)
    os.kill(os.getpid(), signal.{sig})
    return step
checkpoint.Checkpointer.save = save_then_signal
from flax_transformer.cli.hf import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "sig, status, how",
    [("SIGINT", 130, "Ctrl-C"), pytest.param("SIGTERM", 143, "SIGTERM", marks=pytest.mark.slow)],
)
def test_a_signal_during_hf_import_leaves_nothing(hf_dir, tmp_path, sig, status, how):
    workdir = tmp_path / "run"
    code = SIGNAL_MID_IMPORT.format(sig=sig)
    result = run(["-c", code, "import", hf_dir, "--workdir", workdir])
    assert result.returncode == status
    assert one_line(result) == f"interrupted ({how}); nothing half-written was kept"
    assert not workdir.exists() and leftovers(tmp_path) == []


@pytest.mark.slow  # two imports in processes of their own (15-30 s); the sweep is fast in
# tests/test_token_cache.py::test_a_stage_left_by_a_killed_run_is_removed_by_the_next
def test_a_stage_left_by_a_sigkill_is_removed_by_the_next_import(hf_dir, tmp_path):
    """SIGKILL cannot be answered: the import's staging directory stays. The next command
    staging beside it removes it (its owner process is gone), says so, and succeeds."""
    workdir = tmp_path / "run"
    killed = run(["-c", SIGNAL_MID_IMPORT.format(sig="SIGKILL"), "import", hf_dir,
                  "--workdir", workdir])  # fmt: skip
    assert killed.returncode == -9 and not workdir.exists()
    (stage,) = leftovers(tmp_path)
    assert stage.startswith(".run.partial-")
    retry = run(["-m", "flax_transformer.hf", "import", hf_dir, "--workdir", workdir])
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert f"removed {tmp_path / stage}: left unfinished by a stopped run" in retry.stderr
    assert leftovers(tmp_path) == [] and (workdir / "config.json").exists()


SIGNAL_MID_CONVERT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (see above)
import safetensors.numpy
save_file = safetensors.numpy.save_file
def save_then_signal(tensors, path, *args, **kwargs):
    save_file(tensors, path, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
safetensors.numpy.save_file = save_then_signal
from flax_transformer.cli.convert import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_convert_leaves_no_output(tmp_path):
    source = tmp_path / "torch.safetensors"
    save_torch_state(source, torch_state(), CONFIG)
    out = tmp_path / "flax.safetensors"
    result = run(["-c", SIGNAL_MID_CONVERT, source, "--out", out])
    assert result.returncode == 130
    assert one_line(result) == "interrupted (Ctrl-C); nothing half-written was kept"
    assert not out.exists() and leftovers(tmp_path) == []


TINY = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "100",
    "--task-valid-size", "8", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--dropout", "0", "--warmup", "2",
    "--steps", "8", "--save-every", "4", "--eval-every", "100",
]  # fmt: skip


@pytest.mark.slow  # a training run (about 10 s)
def test_training_past_a_real_file_size_limit_is_one_line(tmp_path):
    """Orbax's own error log and tensorstore's leftover callbacks used to bury the one line."""
    workdir = tmp_path / "run"
    result = run(["train.py", *TINY, "--workdir", workdir], limit=LIMIT_BYTES // 4)
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith("error: the file-size limit (ulimit -f) stopped the write of ")
    assert "stopping. Nothing was deleted" in line
    checkpoints = workdir / "checkpoints"
    assert not [p for p in checkpoints.iterdir() if "tmp" in p.name]


def test_a_failed_staging_directory_stays_removed_when_a_late_writer_adds_to_it(tmp_path):
    """The flake behind the import test above, under load: after a failed Orbax save its
    tensorstore threads may still write into the staging directory while it is removed."""
    out = tmp_path / "run"

    def late_writer(staging):
        time.sleep(0.03)  # after the first removal, as a still-running save thread would
        (staging / "checkpoints" / "0").mkdir(parents=True, exist_ok=True)
        (staging / "checkpoints" / "0" / "params").write_bytes(b"\0" * 10)

    writers = []
    with pytest.raises(OSError, match="disk full"):
        with staged_directory(out) as staging:
            (staging / "config.json").write_text("{}")
            writers.append(threading.Thread(target=late_writer, args=(staging,)))
            writers[0].start()
            raise OSError(28, "disk full")
    writers[0].join()
    assert not out.exists() and leftovers(tmp_path) == []


# Ctrl-C in a terminal reaches the whole process group: the command and its pool's workers.
CTRL_C_MID_TOKENIZATION = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (see above)
sys.path.insert(0, os.getcwd())
from flax_transformer.data import token_cache
append = token_cache._Appender.append
def append_then_ctrl_c(self, *args):
    append(self, *args)
    os.killpg(os.getpgid(0), signal.SIGINT)
token_cache._Appender.append = append_then_ctrl_c
import train
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.slow  # an 9 MB corpus scanned, then tokenized by a pool (about 15 s)
def test_ctrl_c_while_a_pool_tokenizes_is_one_line(tmp_path):
    """The pool's workers printed ~40 lines of `Process SpawnPoolWorker-N:` tracebacks on
    Ctrl-C; now the command alone answers: one line, exit 130, nothing left, and the retry
    works."""
    corpus = tmp_path / "big.tsv"
    line = "le chat noir dort sur le tapis\tthe black cat sleeps on the mat\n"
    corpus.write_text(line * (9_500_000 // len(line)))  # above POOL_MIN_BYTES: a pool
    workdir = tmp_path / "run"
    argv = ["--train-tsv", corpus, "--workdir", workdir, "--steps", "1", "--max-len", "64"]
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_MID_TOKENIZATION, *map(str, argv)],
        cwd=REPO, capture_output=True, text=True, timeout=300, start_new_session=True,
    )  # fmt: skip
    assert result.returncode == 130, result.stderr[-3000:]
    assert "SpawnPoolWorker" not in result.stderr and "Traceback" not in result.stderr, (
        result.stderr[-3000:]
    )
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert not workdir.exists() and not list(tmp_path.glob(".token_cache.partial-*"))


@pytest.fixture
def full_filesystem(tmp_path):
    """A real file system with no room left: a 64 KiB tmpfs, filled (needs root, as CI has;
    skipped elsewhere). Yields its mount point."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        with open(mount / "filler", "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass  # full
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow  # a training run (about 10 s)
def test_a_full_disk_under_the_event_files_is_one_line_naming_the_file(tmp_path, full_filesystem):
    """tensorboardX wrote from its own thread and closed from an atexit hook: a full disk
    printed two tracebacks and a line naming no file. Now one line naming the event file."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "tensorboard").symlink_to(full_filesystem, target_is_directory=True)
    result = run(["train.py", *TINY, "--workdir", workdir])
    assert result.returncode == 1, result.stderr[-3000:]
    line = one_line(result)
    events = workdir / "tensorboard" / "events.out.tfevents."
    assert line.startswith(f"error: the disk is full: cannot write {events}"), line
    assert "stopping. Nothing was deleted: the last good checkpoint is step 8" in line


# As in a shell: pytest-xdist's workers ignore SIGINT and a child inherits that; a first Python
# restores it and becomes the command (exec), so that no fork of this process runs Python.
DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.slow  # a training run's start and compile (about 10 s)
@pytest.mark.parametrize("sig, status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_the_step_compiles_ends_the_process_cleanly(tmp_path, sig, status):
    """Stopped while XLA compiles the first step, the process said its one line and then
    crashed in Python's teardown (SIGSEGV, exit -11; bench.chaos found it). It ends with the
    signal's status now."""
    import os
    import signal

    workdir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT, "train.py", *TINY, "--workdir", str(workdir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in proc.stdout:  # the model line comes just before the first step compiles
        if "model:" in line:
            break
    time.sleep(0.3)
    os.kill(proc.pid, getattr(signal, sig))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err[-3000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]


LOST_IN_A_FINALIZER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (see above)
from flax_transformer.files.interruptions import one_line_failures
class Finalized:
    def __del__(self):
        raise KeyboardInterrupt  # as Ctrl-C landing in JAX's gc callback
@one_line_failures
def main():
    Finalized()  # dropped at once: its __del__ is where the interruption lands
    for _ in range(10**7):
        pass
    print("finished")
    return 0
sys.exit(main())
"""


def test_a_ctrl_c_landing_in_a_finalizer_is_not_lost():
    """bench.chaos: Ctrl-C landed in JAX's `_xla_gc_callback`; Python printed "Exception ignored
    in ..." with a traceback, dropped it, and the import went on to exit 0. It is delivered
    again: one line, exit 130."""
    result = run(["-c", LOST_IN_A_FINALIZER])
    assert result.returncode == 130, result.stderr[-3000:]
    assert one_line(result) == "interrupted (Ctrl-C); nothing half-written was kept"
    assert "finished" not in result.stdout


SIGNAL_IN_THE_TEARDOWN = """
import atexit, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a shell (see above)
from flax_transformer.cli.process import exit_process
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))
print("done")
exit_process(0)
"""


def test_a_ctrl_c_after_the_work_is_done_keeps_the_status():
    """bench.chaos: a Ctrl-C as a finished import's process ended killed it with the signal
    (exit -2): Python restores the default actions while it finalizes. The work is done; the
    status stays 0 and nothing is printed."""
    result = run(["-c", SIGNAL_IN_THE_TEARDOWN])
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr[-3000:]
    assert result.stderr == ""
