"""Multi-process training for real: several train.py processes joined by jax.distributed on
this machine (CPU devices, gloo collectives over loopback TCP), the same code a cluster runs.

Two processes end where one process with as many devices ends; one process dying stops the
other within a bounded time, and --resume then completes the run to the same parameters.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flax_transformer.cli.launch import free_port
from flax_transformer.interop.convert import load_safetensors
from flax_transformer.runs.spec import spec_values

ROOT = Path(__file__).resolve().parents[1]
ARGS = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "300",
    "--task-valid-size", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--steps", "4", "--warmup", "2",
    "--eval-every", "2", "--save-every", "2", "--log-every", "2", "--dropout", "0.0",
    "--lr", "2e-3",
]  # fmt: skip
LR, STEPS = 2e-3, 4
# The same step hook in every process; it SIGKILLs process 1 after step 3, once the step-2
# checkpoint is complete.
KILL_PROCESS_1 = """
import os, signal, sys
import jax
import train
from flax_transformer.runs.spec import spec_values

def kill(info):
    if info.event == "step" and info.step == 3 and jax.process_index() == 1:
        info.wait_for_checkpoints()
        os.kill(os.getpid(), signal.SIGKILL)

sys.exit(train.main(sys.argv[1:], hooks=[kill]))
"""


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """The runs of this module compile many of the same programs (evaluation, decoding, the
    2-process train step): they share JAX's persistent compilation cache, which holds the
    executable XLA compiled for a program (same program, same executable, same numbers)."""
    directory = tmp_path_factory.mktemp("jax_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAX_COMPILATION_CACHE_DIR", str(directory))
        patch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        patch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
        yield directory


def run(cmd, devices=None):
    # Every process inherits the session's fast-compile XLA_FLAGS (conftest.py).
    env = dict(os.environ)
    if devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def one_process(workdir, mesh, devices, flags=ARGS):
    cmd = [sys.executable, "train.py", *flags, "--mesh", mesh, "--workdir", str(workdir)]
    result = run(cmd, devices)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def launched(workdir, processes, *train_flags, devices_per_process=None):
    # Every process's lines (the checks below read process 1's too; the default shows process
    # 0's and the others' errors).
    cmd = [sys.executable, "-m", "flax_transformer.launch", "--processes", str(processes)]
    cmd += ["--output", "all"]
    if devices_per_process:
        cmd += ["--devices-per-process", str(devices_per_process)]
    result = run([*cmd, "--", "train.py", *train_flags, "--workdir", str(workdir)])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def assert_same_params(expected_dir, actual_dir, exact=False):
    expected, _ = load_safetensors(expected_dir / "flax_params.safetensors")
    actual, _ = load_safetensors(actual_dir / "flax_params.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        if exact:
            np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
        elif name.endswith("key/bias"):
            # Gradient 0 in exact arithmetic, rounding noise scaled up by Adam: bounded (see
            # test_train_mesh.py and parity_tests/test_training_parity.py).
            assert np.abs(actual[name] - expected[name]).max() <= 2 * LR * STEPS, name
        else:
            np.testing.assert_allclose(actual[name], expected[name], atol=1e-5, err_msg=name)


def assert_same_scores(expected_dir, actual_dir):
    """Evaluation and the final decoding: the numbers of the one-process run."""
    expected = json.loads((expected_dir / "results.json").read_text())
    actual = json.loads((actual_dir / "results.json").read_text())
    for key in ("valid_loss", "token_accuracy"):
        assert actual[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for key in ("exact_match", "bleu", "examples", "steps"):
        assert actual[key] == expected[key], key


def checkpoint_steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """launch --processes 2, one CPU device each, --mesh data=2 (also the uninterrupted run
    of the crash test)."""
    workdir = tmp_path_factory.mktemp("multi") / "two_processes"
    result = launched(workdir, 2, *ARGS, "--mesh", "data=2")
    return workdir, result.stdout


@pytest.mark.slow
def test_two_processes_train_like_one_process_with_two_devices(two_processes, tmp_path):
    workdir, output = two_processes
    one_process(tmp_path / "one", "data=2", devices=2)
    assert_same_params(tmp_path / "one", workdir)
    assert_same_scores(tmp_path / "one", workdir)

    # Both processes trained, over one mesh of both their devices.
    assert "[0] sharded over mesh {'data': 2, 'model': 1} of 2 devices" in output
    assert "[1] sharded over mesh {'data': 2, 'model': 1} of 2 devices" in output
    # Every process wrote its part of each checkpoint (Orbax's per-process OCDBT files) ...
    assert checkpoint_steps(workdir) == [2, 4]
    for step in (2, 4):
        assert (workdir / "checkpoints" / str(step) / "params" / "ocdbt.process_1").is_dir()
    # ... and only process 0 wrote the run's files: each record once, one event file, one
    # summary; run.json keeps no flag of this launch.
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [
        ("train", 2), ("eval", 2), ("train", 4), ("eval", 4),
    ]  # fmt: skip
    assert len(list((workdir / "tensorboard").iterdir())) == 1
    assert "[0] trained 4 steps" in output and "[1] trained" not in output
    saved_flags = spec_values(json.loads((workdir / "run.json").read_text()))
    assert saved_flags["mesh"] == "data=2"
    assert not {"coordinator", "num_processes", "process_id"} & set(saved_flags)


@pytest.mark.slow
def test_two_processes_of_two_devices_train_like_one_process_with_four(tmp_path):
    mesh = ["--mesh", "data=2,model=2"]
    result = launched(tmp_path / "two", 2, *ARGS, *mesh, devices_per_process=2)
    assert "[1] sharded over mesh {'data': 2, 'model': 2} of 4 devices" in result.stdout
    one_process(tmp_path / "one", "data=2,model=2", devices=4)
    assert_same_params(tmp_path / "one", tmp_path / "two")
    assert_same_scores(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_a_dead_process_stops_the_other_and_resume_completes_the_run(two_processes, tmp_path):
    # Started the way a cluster starts them (no launcher to stop the survivor).
    workdir = tmp_path / "crashed"
    port = free_port()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                KILL_PROCESS_1,
                *ARGS,
                "--mesh",
                "data=2",
                "--workdir",
                str(workdir),
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(index),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for index in (0, 1)
    ]
    try:
        processes[1].communicate(timeout=600)
        died = time.monotonic()
        _, err = processes[0].communicate(timeout=60)
        stopped_after = time.monotonic() - died
    finally:
        for process in processes:
            process.kill()
    assert processes[1].returncode == -signal.SIGKILL
    assert processes[0].returncode == 1, err[-3000:]
    assert stopped_after < 60
    assert "error: process 0 of 2: lost contact with another process" in err
    assert "`--resume` continues the run from its last complete checkpoint" in err
    assert checkpoint_steps(workdir) == [2]
    assert not (workdir / "results.json").exists()

    result = launched(workdir, 2, "--resume")
    assert "[0] resumed from step 2" in result.stdout
    assert "[1] resumed from step 2" in result.stdout
    assert_same_params(two_processes[0], workdir, exact=True)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4]


@pytest.mark.slow
def test_two_processes_train_a_token_cache_in_token_batches_like_one_process(tmp_path):
    """A JSONL corpus (the token cache, built by process 0 and read by both) in --batch-tokens
    batches: batches differ in rows, and each process builds its block of every one."""
    rng = np.random.default_rng(0)
    with (tmp_path / "train.jsonl").open("w") as handle:
        for _ in range(300):
            word = "".join(rng.choice(list("abcdef"), size=rng.integers(1, 9)))
            handle.write(json.dumps({"source": word, "target": word[::-1]}) + "\n")
    flags = [a for a in ARGS[8:] if a not in ("--batch-size", "8")]
    flags += ["--train-jsonl", str(tmp_path / "train.jsonl"), "--batch-tokens", "96"]
    result = launched(tmp_path / "two", 2, *flags, "--mesh", "data=2")
    assert "[0] --batch-tokens 96: " in result.stdout
    one_process(tmp_path / "one", "data=2", devices=2, flags=flags)
    assert_same_params(tmp_path / "one", tmp_path / "two")
    assert_same_scores(tmp_path / "one", tmp_path / "two")
    # Process 1 read process 0's cache: one cache, no staging directory left behind.
    assert len(list((tmp_path / "two" / "token_cache").iterdir())) == 1
    assert not list(tmp_path.glob(".token_cache.partial-*"))
