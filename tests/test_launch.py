"""Multi-process training without training: the launcher's flags and process handling, the
distributed flags of train.py, cluster detection, and which rows of a batch a process loads.
(The trained multi-process runs are in test_multiprocess.py.)"""

import io
import json
import sys
import time

import numpy as np
import pytest

import train
from flax_transformer.cli import launch
from flax_transformer.data.pipeline import BatchLoader, encode_pairs, generate_task
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.training.distributed import contiguous_rows, detected_cluster
from flax_transformer.training.options import DistributedOptions, OptionError
from flax_transformer.training.sharding import MeshError


# ----------------------------------------------------------------------------- launcher flags
def test_launcher_splits_its_flags_from_the_command():
    args, command = launch.parse_args(
        ["--processes", "2", "--devices-per-process", "3", "--", "train.py", "--steps", "4"]
    )
    assert (args.processes, args.devices_per_process) == (2, 3)
    assert command == ["train.py", "--steps", "4"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--processes", "2", "train.py"], "give the command after --"),
        (["--processes", "2", "--"], "the command after -- is empty"),
        (["--processes", "0", "--", "train.py"], "--processes must be >= 1, got 0"),
        (["--", "train.py"], "the following arguments are required: --processes"),
        (
            ["--processes", "2", "--devices-per-process", "0", "--", "train.py"],
            "--devices-per-process must be >= 1, got 0",
        ),
        (
            ["--processes", "2", "--", "train.py", "--process-id=1", "--coordinator", "h:1"],
            "the launcher sets --coordinator, --process-id itself",
        ),
    ],
)
def test_launcher_flag_errors_are_argparse_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        launch.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_each_process_gets_the_command_and_its_place():
    command = launch.process_command(["train.py", "--mesh", "data=2"], 4242, 2, 1)
    assert command == [
        sys.executable, "train.py", "--mesh", "data=2",
        "--coordinator", "127.0.0.1:4242", "--num-processes", "2", "--process-id", "1",
    ]  # fmt: skip
    assert launch.process_command(["-m", "pkg.mod"], 1, 1, 0)[:3] == [
        sys.executable,
        "-m",
        "pkg.mod",
    ]
    assert launch.process_command(["mytool", "x"], 1, 1, 0)[:2] == ["mytool", "x"]
    env = launch.process_env(3, {"PATH": "/bin"})
    assert env["JAX_NUM_CPU_DEVICES"] == "3" and env["PATH"] == "/bin"
    assert "JAX_NUM_CPU_DEVICES" not in launch.process_env(None, {})
    assert 0 < launch.free_port() < 65536


# Stand-in processes (no JAX): each prints its id and leaves a mark in the folder given;
# `process-id 1` fails once every process has printed (so that no hello is cut off on a busy
# machine), the others would sleep for a minute.
CHILD = """
import pathlib, sys, time
me = int(sys.argv[sys.argv.index("--process-id") + 1])
marks = pathlib.Path(sys.argv[1])
print(f"hello from {me}", flush=True)
(marks / str(me)).touch()
if me == 1:
    deadline = time.monotonic() + 30
    while len(list(marks.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    print("ValueError: the data ran out", flush=True)
    print("a line after it", flush=True)
    sys.exit(3)
time.sleep(60)
"""


def test_when_one_process_fails_the_launcher_stops_the_others_and_names_it(tmp_path):
    out = io.StringIO()
    started = time.monotonic()
    argv = [sys.executable, "-c", CHILD, str(tmp_path)]
    code = launch.launch(argv, 3, grace=5.0, out=out, output="all")
    elapsed = time.monotonic() - started
    assert code == 3
    assert elapsed < 45  # not the others' 60 s
    lines = out.getvalue().splitlines()
    assert {"[0] hello from 0", "[1] hello from 1", "[2] hello from 2"} <= set(lines)
    assert "[launch] process 1 failed; stopping [0, 2]" in lines
    # The last line, after every process's output: who failed, how, and the last error it said.
    assert lines[-1] == (
        "[launch] process 1 exited with status 3; its last error: ValueError: the data ran out "
        "(stopped processes [0, 2])"
    )


def test_a_failure_after_the_others_finished_is_named_on_the_last_line():
    """The issue's intermittent case: process 1 fails after process 0 has ended well, and the
    last line must still say so (it used to be the progress bar)."""
    child = (
        "import sys, time\n"
        "me = sys.argv[-1]\n"
        "print('train 24/24 |#####|', flush=True)\n"
        "if me == '1':\n"
        "    time.sleep(0.5); sys.exit(1)\n"
    )
    out = io.StringIO()
    assert launch.launch([sys.executable, "-c", child], 2, out=out) == 1
    assert out.getvalue().splitlines()[-1] == (
        "[launch] process 1 exited with status 1; it printed no error; its last line: "
        "train 24/24 |#####|"
    )


def test_a_killed_process_is_named_with_its_signal():
    child = "import os, signal, sys\nif sys.argv[-1] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
    out = io.StringIO()
    assert launch.launch([sys.executable, "-c", child], 2, out=out) == 1
    # Process 1 may still be starting when process 0 dies (a loaded machine): launch then stops
    # it and says so after the same line.
    assert out.getvalue().splitlines()[-1] in (
        "[launch] process 0 was killed by SIGKILL; it printed nothing",
        "[launch] process 0 was killed by SIGKILL; it printed nothing (stopped processes [1])",
    )


def test_the_launcher_succeeds_when_every_process_does():
    out = io.StringIO()
    child = "import sys; print('line one\\rline two', sys.argv[-1])"
    assert launch.launch([sys.executable, "-c", child], 2, out=out, output="all") == 0
    lines = out.getvalue().splitlines()
    assert lines[-1] == "[launch] all 2 processes exited with status 0"
    assert sorted(lines[:-1]) == [
        "[0] line one",
        "[0] line two 0",
        "[1] line one",
        "[1] line two 1",
    ]


def test_by_default_the_others_show_only_their_errors():
    """The processes of one run print the same lines: each line came once per process. By
    default process 0 is shown in full, the others' error lines only (--output all: all)."""
    child = (
        "import sys\n"
        "me = sys.argv[-1]\n"
        "print('step 1: train loss 0.5', flush=True)\n"
        "if me == '1':\n"
        "    print('warning: error: a disk of process 1 is slow', flush=True)\n"
    )
    out = io.StringIO()
    assert launch.launch([sys.executable, "-c", child], 3, out=out) == 0
    lines = out.getvalue().splitlines()
    assert sorted(lines[:-1]) == [
        "[0] step 1: train loss 0.5",
        "[1] warning: error: a disk of process 1 is slow",
    ]
    assert lines[-1] == "[launch] all 3 processes exited with status 0"
    args, _ = launch.parse_args(["--processes", "2", "--output", "all", "--", "x.py"])
    assert args.output == "all"


def test_train_py_outside_the_repository_says_what_runs_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problem = launch.missing_command(["train.py", "--mesh", "data=2"])
    assert problem.startswith("the command's script train.py does not exist (train.py is in")
    assert "ftx launch --processes N -- ftx train ..." in problem


# ----------------------------------------------------------------------------- train.py flags
@pytest.mark.parametrize(
    "values, field, message",
    [
        (dict(coordinator="h:1"), "coordinator", "needs --num-processes and --process-id"),
        (dict(process_id=0), "process_id", "needs --coordinator and --num-processes"),
        (dict(coordinator="h", num_processes=2, process_id=0), "coordinator", "HOST:PORT"),
        (dict(coordinator="h:99999", num_processes=2, process_id=0), "coordinator", "HOST:PORT"),
        (dict(coordinator="h:1", num_processes=0, process_id=0), "num_processes", ">= 1"),
        (dict(coordinator="h:1", num_processes=2, process_id=2), "process_id", "0..1, got 2"),
    ],
)
def test_distributed_options_name_the_bad_flag(values, field, message):
    with pytest.raises(OptionError, match=message) as err:
        DistributedOptions(**values)
    assert err.value.field == field
    DistributedOptions()  # none: a single-process run
    DistributedOptions("10.0.0.1:1234", 8, 7)


def test_train_py_rejects_bad_distributed_flags_before_touching_anything(tmp_path, capsys):
    workdir = tmp_path / "run"
    argv = ["--coordinator", "127.0.0.1:5", "--num-processes", "2", "--process-id", "2"]
    assert train.main([*argv, "--workdir", str(workdir)]) == 2
    assert "error: --process-id must be in 0..1, got 2" in capsys.readouterr().err
    assert train.main(["--num-processes", "2", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "error: --num-processes needs --coordinator and --process-id" in err
    assert not workdir.exists()


def test_train_py_parses_the_distributed_flags():
    assert set(train.DISTRIBUTED_FLAGS) == {"coordinator", "num_processes", "process_id"}
    args = train.parse_args(["--coordinator", "h:1", "--num-processes", "2", "--process-id", "1"])
    assert (args.coordinator, args.num_processes, args.process_id) == ("h:1", 2, 1)


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),  # a laptop
        (
            dict(
                SLURM_JOB_ID="7",
                SLURM_STEP_NODELIST="n1",
                SLURM_NTASKS="4",
                SLURM_PROCID="0",
                SLURM_LOCALID="0",
            ),
            "SLURM",
        ),  # fmt: skip
        (
            dict(
                SLURM_JOB_ID="7",
                SLURM_STEP_NODELIST="n1",
                SLURM_NTASKS="1",
                SLURM_PROCID="0",
                SLURM_LOCALID="0",
            ),
            None,
        ),  # fmt: skip  (a one-task job: one process)
        (dict(SLURM_JOB_ID="7", SLURM_NTASKS="4"), None),  # an allocation, not a job step
        (dict(OMPI_MCA_orte_hnp_uri="1;tcp://10.0.0.1:5", OMPI_COMM_WORLD_SIZE="2"), "Open MPI"),
    ],
)
def test_cluster_jobs_are_detected_and_a_laptop_is_not(environ, expected):
    assert detected_cluster(environ) == expected


# ----------------------------------------------------------------------------- batch rows
def test_a_process_holds_one_contiguous_block_of_rows():
    assert contiguous_rows([slice(0, 2), slice(2, 4)], 8) == slice(0, 4)  # data=4, 2 per process
    assert contiguous_rows([slice(4, 8), slice(4, 8)], 8) == slice(4, 8)  # model=2 in a process
    assert contiguous_rows([slice(None)], 8) == slice(0, 8)  # replicated: every row
    with pytest.raises(MeshError, match=r"rows \[\(0, 2\), \(4, 6\)\] .* not one contiguous"):
        contiguous_rows([slice(0, 2), slice(4, 6)], 8)


def test_each_process_loads_exactly_its_rows_of_the_global_batches():
    tokenizer = ByteTokenizer()
    dataset = encode_pairs(generate_task("reverse", 45, 0, 1, 12), tokenizer, 16)
    whole = BatchLoader(dataset, 8, 16, seed=3)
    halves = [BatchLoader(dataset, 8, 16, seed=3, rows=slice(r, r + 4)) for r in (0, 4)]
    short = 0
    for _ in range(12):  # more than an epoch: the bucket's last, short batches too
        batch = next(whole)
        parts = [next(loader) for loader in halves]
        short += int((batch["tgt_out"] == 0).all(axis=1).any())
        for name in batch:
            assert all(part[name].shape[0] == 4 for part in parts)
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), batch[name])
    assert short  # some batches had padding rows, and they were split the same way
    assert halves[1].state() == whole.state()  # checkpoints hold the same position


def test_json_holds_stdout_alone_and_the_lines_go_to_stderr(capsys):
    child = "print('hello', flush=True)\n"
    assert launch.main(["--processes", "2", "--json", "--", sys.executable, "-c", child]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result == {"command": [sys.executable, "-c", child], "processes": 2, "exit_status": 0}
    assert "[0] hello" in captured.err and "[launch] all 2 processes" in captured.err
