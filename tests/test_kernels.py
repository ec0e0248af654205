"""kernels/: the native kernels built once (`ftx kernels build`), never inside a library call;
a cache entry trusted only when its size and checksum are the ones written at build time; one
switch object (KERNELS) whose bad values are one line and exit 2 in every command; `ftx info`.

Every test uses a private kernel cache (FLAX_TRANSFORMER_CACHE=tmp_path), never the user's.
The fast tests build with a stand-in compiler (a script that writes a file of fixed bytes), so
nothing here compiles C++ but the slow test, which builds the real reorder kernel, cuts it short
and runs `ftx generate` beside an XLA-only run."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer.cli import kernels as kernels_cli
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.kernels import build, cache, cpu, load
from flax_transformer.kernels.libraries import HERE, LIBRARIES
from flax_transformer.kernels.switches import KERNELS, SwitchError

ROOT = Path(__file__).resolve().parents[1]
REORDER = LIBRARIES["beam_reorder"]
LINUX_X86 = cpu.platform_problem() is None  # (read before any test patches it)
FAKE_CXX = """#!/bin/sh
# A stand-in compiler: `--version` answers, anything else writes 4096 bytes to the -o file.
[ "$1" = "--version" ] && { echo "fake-c++ 1.0"; exit 0; }
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
head -c 4096 /dev/urandom > "$out"
"""


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """An empty kernel cache of this test's own, the stand-in compiler as $CXX, the platform
    taken as Linux x86-64, and no "said once" memory of earlier tests."""
    fake = tmp_path / "fake-c++"
    fake.write_text(FAKE_CXX)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FLAX_TRANSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setattr(cpu, "platform_problem", lambda: None)
    monkeypatch.setattr(load, "_said", set())
    return tmp_path / "cache" / "kernels"


def never_loaded(monkeypatch):
    """Make any attempt to load a shared library fail the test."""

    def refuse(path, *args, **kwargs):
        raise AssertionError(f"loaded {path}")

    monkeypatch.setattr(load.ctypes, "CDLL", refuse)


def entries(directory: Path) -> list[str]:
    """What a build left in the cache, but its lock file."""
    return sorted(p.name for p in directory.iterdir() if p.name != ".build.lock")


def kernel_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flax_transformer.kernels"]


# --- the cache: built once, checked before every load ---------------------------------------


def test_a_build_writes_the_library_and_its_manifest(private_cache):
    result = build.build(REORDER)
    assert result.state == "built" and result.path.parent == private_cache
    manifest = json.loads(cache.manifest_path(result.path).read_text())
    assert manifest["size"] == 4096 == result.path.stat().st_size
    assert manifest["sha256"] == cache.file_digest(result.path)
    assert manifest["compiler_version"] == "fake-c++ 1.0" and manifest["flags"] == list(
        REORDER.flags
    )
    assert cache.check(REORDER).state == "ok"
    assert build.build(REORDER).state == "present"  # built once
    assert entries(private_cache) == sorted(
        [result.path.name, cache.manifest_path(result.path).name]
    )  # no temporary directory left


@pytest.mark.parametrize("damage", ["truncated", "same size, other bytes", "no manifest"])
def test_a_damaged_library_is_one_line_and_the_xla_path_never_loaded(
    damage, private_cache, monkeypatch, caplog
):
    path = build.build(REORDER).path
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:1000])
    elif damage == "same size, other bytes":
        path.write_bytes(bytes(b ^ 1 for b in data))
    else:
        cache.manifest_path(path).unlink()
    never_loaded(monkeypatch)
    monkeypatch.setenv(KERNELS.reorder.variable, "auto")
    for _ in range(3):  # asked at every trace: said once
        choice = KERNELS.reorder.choose()
        assert choice.library is None and str(path) in choice.why
    assert "skipped, never loaded; `ftx kernels build` rebuilds it" in choice.why
    lines = kernel_lines(caplog)
    assert len(lines) == 1 and str(path) in lines[0], lines
    if damage == "truncated":
        assert "(1000 bytes, 4096 when built)" in lines[0]
    # the build command rebuilds it (a library call only skips it)
    assert build.build(REORDER).state == "built"
    assert cache.check(REORDER).state == "ok"


def test_a_changed_source_flags_or_jax_is_another_entry(private_cache, tmp_path, monkeypatch):
    built = build.build(REORDER).path
    assert cache.check(REORDER).path == built
    other_flags = dataclasses.replace(REORDER, flags=(*REORDER.flags, "-g"))
    assert cache.library_path(other_flags) != built
    with monkeypatch.context() as m:
        m.setattr(cache, "toolchain_versions", lambda: {"jax": "9.9", "jaxlib": "9.9"})
        assert cache.library_path(REORDER) != built
    # the same source with one byte changed: not built, and the stale entry is named as such
    sources = tmp_path / "sources"
    sources.mkdir()
    for name in (REORDER.source, "native_pool.h"):
        (sources / name).write_bytes((HERE / name).read_bytes())
    (sources / REORDER.source).write_bytes((HERE / REORDER.source).read_bytes() + b"\n")
    monkeypatch.setattr(cache, "HERE", sources)
    entry = cache.check(REORDER)
    assert entry.state == "missing" and entry.path != built
    assert "the cache holds only a stale build" in entry.problem


def test_a_library_call_never_compiles_or_writes(private_cache, monkeypatch, caplog):
    """Without a built kernel: XLA's path, one line for the process, no compiler run, nothing
    written (the cache directory is not even made)."""

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(build.subprocess, "run", no_compiler)
    for switch in KERNELS:
        monkeypatch.setenv(switch.variable, "auto")
        for _ in range(2):
            assert switch.choose().library is None
    assert not private_cache.parent.exists()
    lines = kernel_lines(caplog)
    assert len(lines) == 1 and "`ftx kernels build`" in lines[0] and "ftx info" in lines[0]


# --- ftx kernels build: one line for what stops it, and the XLA path keeps working ------------


def run_build(argv, capsys):
    code = kernels_cli.main(["build", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("how", ["PATH without a compiler", "CXX pointing nowhere"])
def test_no_compiler_is_one_line(how, private_cache, monkeypatch, capsys):
    if how == "PATH without a compiler":
        monkeypatch.delenv("CXX")
        monkeypatch.setenv("PATH", str(private_cache.parent.parent / "empty"))
    else:
        monkeypatch.setenv("CXX", "/nowhere/g++")
    code, out, err = run_build(["--all"], capsys)
    assert code == 1 and len(err.splitlines()) == 1, err
    want = "no C++ compiler" if how.startswith("PATH") else "CXX=/nowhere/g++ is not a compiler"
    assert want in err and "XLA's own operations run in their place" in err
    assert "beam_reorder" in err and "Traceback" not in err
    monkeypatch.setenv(KERNELS.reorder.variable, "auto")
    assert KERNELS.reorder.choose().library is None


def test_an_unwritable_cache_is_one_line(private_cache, monkeypatch, capsys):
    blocker = private_cache.parent.parent / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLAX_TRANSFORMER_CACHE", str(blocker / "cache"))
    code, out, err = run_build(["--all"], capsys)
    assert code == 1 and len(err.splitlines()) == 1, err
    assert f"cannot write the kernel cache {blocker}" in err and "Traceback" not in err
    monkeypatch.setenv(KERNELS.reorder.variable, "auto")
    choice = KERNELS.reorder.choose()
    assert choice.library is None and "not built" in choice.why


def test_a_failed_compile_leaves_nothing(private_cache, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    code, out, err = run_build(["--all"], capsys)
    assert code == 1 and "false failed" in err and "Traceback" not in err
    assert entries(private_cache) == []  # nothing half-written


def test_build_skips_what_this_cpu_cannot_run(private_cache, monkeypatch, capsys):
    monkeypatch.setattr(cpu, "cpu_flags", lambda cpuinfo=None: {"avx2", "fma"})
    code, out, err = run_build([], capsys)
    assert code == 0 and err == ""
    assert "int8_amx: skipped: this CPU lacks amx_int8 and amx_tile" in out
    assert "f32_packed_avx512: skipped: this CPU lacks avx512f" in out
    assert "f32_packed_avx2: built" in out and "beam_reorder: built" in out
    code, out, _ = run_build(["--json"], capsys)
    states = {row["library"]: row["state"] for row in json.loads(out)["libraries"]}
    assert code == 0 and states["beam_reorder"] == "present" and states["int8_amx"] == "skipped"


# --- the one switch object ------------------------------------------------------------------


@pytest.mark.parametrize("switch", list(KERNELS), ids=lambda s: s.name)
def test_a_bad_value_names_the_variable_and_its_values(switch, monkeypatch):
    monkeypatch.setenv(switch.variable, "bogus")
    problem = KERNELS.preflight()
    assert problem.startswith(f"{switch.variable}='bogus' is not a kernel switch value")
    assert f"use one of {', '.join(switch.choices)}" in problem
    with pytest.raises(SwitchError, match=switch.variable):
        switch.choose()


def test_switch_values_are_read_case_and_space_blind(monkeypatch):
    monkeypatch.setenv(KERNELS.reorder.variable, " XLA ")
    assert KERNELS.reorder.value() == "xla" and KERNELS.preflight() is None


def test_one_line_failures_turns_a_switch_error_into_exit_2(capsys):
    @one_line_failures
    def main(argv):
        raise SwitchError("FLAX_TRANSFORMER_F32_KERNEL=avx512, but ... cannot run here")

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err == "error: FLAX_TRANSFORMER_F32_KERNEL=avx512, but ... cannot run here\n"


def ftx(argv, env_extra, cwd, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "flax_transformer.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def forced_unavailable() -> list:
    """(variable, value) forcing a kernel this CPU lacks (the reason differs by machine)."""
    cases = []
    for switch in KERNELS:
        for value, library in switch.builds:
            why = cpu.missing_flags(LIBRARIES[library].cpu)
            if why is not None:
                cases.append(pytest.param(switch.variable, value, why, id=f"{value}-lacking"))
    # a kernel not built (an empty cache): the same on every machine
    cases.append(
        pytest.param("FLAX_TRANSFORMER_REORDER_KERNEL", "native", "not built", id="unbuilt")
    )
    return cases


@pytest.mark.parametrize("command", ["generate", "score", "train", "info", "export", "hf"])
def test_every_command_says_a_bad_switch_in_one_line_exit_2(command, tmp_path):
    """A real `ftx` process: one line naming the variable and its values, before any work."""
    argv = {"generate": ["--workdir", "nowhere"], "score": ["--workdir", "x", "--test-tsv", "y"]}
    argv |= {"train": ["--steps", "1"], "export": ["--workdir", "x"], "hf": ["import", "x"]}
    env = {"FLAX_TRANSFORMER_REORDER_KERNEL": "bogus", "FLAX_TRANSFORMER_CACHE": str(tmp_path)}
    result = ftx([command, *argv.get(command, [])], env, tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "error: FLAX_TRANSFORMER_REORDER_KERNEL='bogus' is not a kernel switch value: use one "
        "of auto, xla, native (auto: the in-place beam reorder kernel where it runs, else XLA's "
        "gather; xla: always XLA's gather)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written, no run directory


@pytest.mark.parametrize(("variable", "value", "why"), forced_unavailable())
def test_a_kernel_forced_where_it_cannot_run_is_one_line_exit_2(variable, value, why, tmp_path):
    env = {variable: value, "FLAX_TRANSFORMER_CACHE": str(tmp_path)}
    result = ftx(["generate", "--workdir", "nowhere"], env, tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable}={value}, but "), lines
    assert why in lines[0] and f"set {variable} to auto or xla" in lines[0]


# --- ftx info ---------------------------------------------------------------------------------


def test_ftx_info_lines_and_json(private_cache, tmp_path, monkeypatch, capsys):
    """On an empty cache (in this process), then on one where the reorder kernel is damaged (a
    real process, --json): every kernel is listed with its switch and why it does not run; one
    line about the damaged library on stderr, which is skipped."""
    import flax_transformer
    from flax_transformer.cli import info

    env = {"FLAX_TRANSFORMER_CACHE": str(private_cache.parent)}
    env |= {switch.variable: "auto" for switch in KERNELS}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert info.main([]) == 0
    out, err = capsys.readouterr()
    assert err == ""

    assert out.startswith(f"flax-transformer {flax_transformer.__version__}")
    assert "backend cpu" in out and "vector extensions: " in out
    assert f"kernel cache: {private_cache}" in out
    for switch in KERNELS:
        assert f"{switch.variable}=auto: {switch.fallback}, because " in out
    if LINUX_X86:
        assert "beam_reorder is not built; `ftx kernels build` builds it" in out
    # damaged: a library with a manifest, then cut short
    path = build.build(REORDER).path
    path.write_bytes(path.read_bytes()[:100])
    result = ftx(["info", "--json"], env, tmp_path)
    assert result.returncode == 0
    info = json.loads(result.stdout)
    assert set(info) >= {"version", "jax", "cpu", "kernel_cache", "kernels"}
    assert info["cpu"]["vector_extensions"] == cpu.vector_extensions()
    kernels = {k["kernel"]: k for k in info["kernels"]}
    assert set(kernels) == {"int8", "f32", "reorder"}
    assert not any(k["active"] for k in kernels.values())
    if LINUX_X86:
        assert "(100 bytes, 4096 when built)" in kernels["reorder"]["why"]
        assert result.stderr.count("\n") == 1 and str(path) in result.stderr


def test_the_kernel_sources_are_package_data():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["flax_transformer"]
    shipped = {p for pattern in patterns for p in (ROOT / "flax_transformer").glob(pattern)}
    sources = {HERE / lib.source for lib in LIBRARIES.values()} | {HERE / "native_pool.h"}
    assert sources <= shipped


# --- end to end: a real library, cut short, and `ftx generate` --------------------------------


@pytest.mark.slow  # builds the kernels (10-15 s), then four `ftx generate` processes: 60-75 s
@pytest.mark.skipif(build.compiler()[0] is None, reason="no C++ compiler")
@pytest.mark.skipif(not LINUX_X86, reason="the kernels need Linux x86-64")
def test_a_truncated_real_library_gives_one_line_and_the_same_tokens(tmp_path):
    """Loading a shared library cut short can kill the process (SIGBUS). With the check, `ftx
    generate` says so in one line and decodes with XLA's gather: the same output as with the
    kernel intact and with the switch at xla. So do a machine without a compiler and a cache
    that cannot be written (one line: not built)."""
    from tests.export_runs import fabricate_run

    run = fabricate_run(tmp_path / "run", "seq2seq")
    inputs = tmp_path / "in.txt"
    inputs.write_text("hello\nabc\na longer line\n")
    env = {"FLAX_TRANSFORMER_CACHE": str(tmp_path / "cache"), "CXX": ""}
    built = ftx(["kernels", "build"], env, tmp_path, timeout=300)
    assert built.returncode == 0, built.stderr
    argv = ["generate", "--workdir", str(run), "--input", str(inputs), "--beam", "3"]
    argv += ["--max-new-tokens", "8"]
    shutil.copytree(tmp_path / "cache", tmp_path / "cut")  # the same entries, one cut short
    library = next((tmp_path / "cut" / "kernels").glob("beam_reorder-*.so"))
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 3])
    envs = [env, env | {"FLAX_TRANSFORMER_REORDER_KERNEL": "xla"}]
    envs.append(env | {"FLAX_TRANSFORMER_CACHE": str(tmp_path / "cut")})
    (tmp_path / "a-file").write_text("not a directory")
    blocked = str(tmp_path / "a-file" / "cache")  # no compiler, and a cache that cannot be made
    envs.append(
        env | {"CXX": "/nowhere/g++", "PATH": "/nowhere", "FLAX_TRANSFORMER_CACHE": blocked}
    )
    with concurrent.futures.ThreadPoolExecutor(len(envs)) as pool:  # side by side
        intact, xla, cut, *unbuilt = pool.map(lambda e: ftx(argv, e, tmp_path), envs)
    assert intact.returncode == xla.returncode == cut.returncode == 0, cut.stderr
    assert intact.stderr == xla.stderr == ""
    assert cut.stdout == intact.stdout == xla.stdout and len(cut.stdout.splitlines()) == 3
    lines = cut.stderr.splitlines()
    assert len(lines) == 1 and str(library) in lines[0] and "damaged" in lines[0], lines
    for result in unbuilt:
        assert result.returncode == 0 and result.stdout == xla.stdout, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "the native kernels are not built" in lines[0], lines
