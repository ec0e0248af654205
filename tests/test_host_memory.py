"""training/host_memory.py: the training commands re-execute with glibc tunables that keep XLA's
per-step temporaries mapped, so a step no longer faults in (and zeroes) them again."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flax_transformer.training import host_memory
from flax_transformer.training.host_memory import TUNABLES, parse_tunables, tuned_environment

ROOT = Path(__file__).resolve().parents[1]
ON_GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


@pytest.fixture
def no_plugin(monkeypatch):
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda environ: False)


def test_adds_every_tunable_and_keeps_the_rest_of_the_environment(no_plugin):
    if not ON_GLIBC:
        pytest.skip("glibc only")
    env = tuned_environment({"PATH": "/bin", "X": "1"})
    assert env["PATH"] == "/bin" and env["X"] == "1"
    assert parse_tunables(env["GLIBC_TUNABLES"]) == TUNABLES


def test_the_users_tunables_win_and_are_kept(no_plugin):
    if not ON_GLIBC:
        pytest.skip("glibc only")
    user = "glibc.malloc.arena_max=4:glibc.rtld.optional_static_tls=2048"
    got = parse_tunables(tuned_environment({"GLIBC_TUNABLES": user})["GLIBC_TUNABLES"])
    assert got["glibc.malloc.arena_max"] == "4"
    assert got["glibc.rtld.optional_static_tls"] == "2048"
    assert got["glibc.malloc.mmap_max"] == TUNABLES["glibc.malloc.mmap_max"]


def test_nothing_to_do_once_set_so_the_re_execution_cannot_loop(no_plugin):
    done = ":".join(f"{k}={v}" for k, v in TUNABLES.items())
    assert tuned_environment({"GLIBC_TUNABLES": done}) is None


def test_the_users_malloc_variables_win(no_plugin):
    if not ON_GLIBC:
        pytest.skip("glibc only")
    env = tuned_environment({"MALLOC_ARENA_MAX": "8"})
    assert "glibc.malloc.arena_max" not in parse_tunables(env["GLIBC_TUNABLES"])
    assert "glibc.malloc.mmap_max" in parse_tunables(env["GLIBC_TUNABLES"])


def test_once_re_executed_never_again_even_if_the_loader_dropped_the_tunables(no_plugin):
    if not ON_GLIBC:
        pytest.skip("glibc only")
    env = tuned_environment({})
    assert env[host_memory.DONE] == "1"
    del env["GLIBC_TUNABLES"]  # what a setuid interpreter's loader does
    assert tuned_environment(env) is None


def test_opt_out_off_glibc_and_on_accelerators(monkeypatch, no_plugin):
    assert tuned_environment({"FLAX_TRANSFORMER_MALLOC": "system"}) is None
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert tuned_environment({}) is None
    monkeypatch.undo()
    if not ON_GLIBC:
        return
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda environ: True)
    assert tuned_environment({}) is None  # JAX would train on the device
    assert tuned_environment({"JAX_PLATFORMS": "cpu"}) is not None


def clean_environment(**env: str) -> dict[str, str]:
    """This environment without the tunables or the re-execution marker (pytest itself may run
    under them), JAX on the CPU, this tree importable, and `env`."""
    dropped = ("GLIBC_TUNABLES", host_memory.DONE, host_memory.OPT_OUT)
    environ = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **env}


def run_python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


REEXEC = """
    import json, os, signal, sys
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc
    print("before")  # still in the buffer at the exec: flushed, so printed by both images
    reexec_with_tuned_malloc()
    blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    print(json.dumps([os.getpid(), sys.argv[1:], os.environ.get("GLIBC_TUNABLES"), blocked]))
"""


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_re_executes_the_same_command_in_the_same_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(REEXEC), "a b", "--flag"],
        env=clean_environment(),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    first, second, last = out.splitlines()
    assert first == second == "before"  # two images ran, the first one's output kept
    pid, argv, tunables, blocked = json.loads(last)
    assert pid == proc.pid and argv == ["a b", "--flag"]
    assert parse_tunables(tunables) == TUNABLES
    # Held across the exec, let through after it: Ctrl-C works in the new image.
    assert not {int(signal.SIGINT), int(signal.SIGTERM)} & set(blocked), blocked


# Ways of running a script in which re-executing the process would restart something else.
NOT_A_PROGRAM = {
    "runpy from a host program": "import runpy; runpy.run_path({script!r}, run_name='__main__')",
}


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
@pytest.mark.parametrize("how", [*NOT_A_PROGRAM, "stdin"])
def test_no_re_execution_when_the_script_is_not_the_program(how, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(REEXEC).replace('print("before")', "print(1)"))
    if how == "stdin":  # `python - < script.py`: a second image would read an empty stdin
        command, stdin = [sys.executable, "-"], script.read_text()
    else:
        command, stdin = [sys.executable, "-c", NOT_A_PROGRAM[how].format(script=str(script))], ""
    proc = subprocess.run(
        command, input=stdin, env=clean_environment(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "1" and len(lines) == 2  # one image, nothing restarted
    assert json.loads(lines[1])[2] is None  # no tunables


# The entry points call it before anything else: with os.execve replaced (sitecustomize runs at
# start-up) by a stub that exits 42, each training entry stops there; others do not.
SITECUSTOMIZE = "import os, sys\nos.execve = lambda *args: sys.exit(42)\n"


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["train.py", "--help"], 42),
        (["-m", "flax_transformer.train", "--help"], 42),
        (["-m", "flax_transformer.cli", "train", "--help"], 42),
        (["-m", "flax_transformer.cli", "--help"], 0),
        (["-m", "bench.ab_step", "--help"], 42),
    ],
    ids=["train.py", "-m flax_transformer.train", "ftx train", "ftx --help", "bench.ab_step"],
)
def test_training_entry_points_re_execute_first(argv, status, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = clean_environment(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == status, proc.stderr[-2000:]


# A jitted function whose 64 MiB temporary (exp(x), the product's input) XLA allocates on
# every call; the minor page faults of the last three calls are printed.
FAULTS = """
    import resource
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc
    reexec_with_tuned_malloc()
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x, w: jnp.exp(x) @ w)
    x, w = jnp.ones((4096, 4096)) * 1e-3, jnp.ones((4096, 8))
    for _ in range(3):
        f(x, w).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        f(x, w).block_until_ready()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_a_steps_temporaries_are_not_faulted_in_again():
    pages = 3 * 64 * 2**20 // 4096  # three calls' temporaries in 4 KiB pages
    tuned = int(run_python(FAULTS).stdout.split()[-1])
    assert tuned < pages // 20, tuned
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[always]" in thp.read_text():
        return  # glibc's mmap gets 2 MiB pages there: few faults either way
    system = int(run_python(FAULTS, FLAX_TRANSFORMER_MALLOC="system").stdout.split()[-1])
    assert system > pages // 2, system  # glibc's default: mmap and munmap on every call
