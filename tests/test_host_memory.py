"""training/host_memory.py: the training commands re-execute with glibc tunables that keep XLA's
per-step temporaries mapped, so a step no longer faults in (and zeroes) them again."""

from __future__ import annotations

import json
import os
import platform
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
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: False)


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


def test_opt_out_off_glibc_and_on_accelerators(monkeypatch, no_plugin):
    assert tuned_environment({"FLAX_TRANSFORMER_MALLOC": "system"}) is None
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert tuned_environment({}) is None
    monkeypatch.undo()
    if not ON_GLIBC:
        return
    monkeypatch.setattr(host_memory, "accelerator_plugin_installed", lambda: True)
    assert tuned_environment({}) is None  # JAX would train on the device
    assert tuned_environment({"JAX_PLATFORMS": "cpu"}) is not None


def run_python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


REEXEC = """
    import json, os, sys
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc
    reexec_with_tuned_malloc()
    print(json.dumps([os.getpid(), sys.argv[1:], os.environ.get("GLIBC_TUNABLES")]))
"""


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_re_executes_the_same_command_in_the_same_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(REEXEC), "a b", "--flag"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    lines = out.splitlines()
    assert len(lines) == 1  # the first image printed nothing before it was replaced
    pid, argv, tunables = json.loads(lines[0])
    assert pid == proc.pid and argv == ["a b", "--flag"]
    assert parse_tunables(tunables) == TUNABLES


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
    system = int(run_python(FAULTS, FLAX_TRANSFORMER_MALLOC="system").stdout.split()[-1])
    tuned = int(run_python(FAULTS, JAX_PLATFORMS="cpu").stdout.split()[-1])
    assert system > pages // 2, system  # glibc's default: mmap and munmap on every call
    assert tuned < pages // 20, tuned
