"""Ctrl-C or SIGTERM while a command's process starts (imports JAX, re-executes itself): one line
and 130 / 143, never a traceback or a crash (cli/process.import_command, files.interruptions.
interrupt_exits_at_once). bench.chaos found a KeyboardInterrupt traceback from inside an import
of `train.py --resume`, and a SIGSEGV when a Ctrl-C stopped a lazy `import jax` halfway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}

# The signal lands 50 ms into the import of the command and of JAX (which take a second or more).
SIGNAL_DURING_IMPORT = """
import os, signal, sys, threading
from flax_transformer.cli.process import import_command
threading.Timer(0.05, os.kill, (os.getpid(), signal.{sig})).start()
import_command("flax_transformer.cli.generate", ["--workdir", "no-such-run"])
print("the import finished first")
"""


@pytest.mark.parametrize(
    "sig, status, how", [("SIGINT", 130, "Ctrl-C"), ("SIGTERM", 143, "SIGTERM")]
)
def test_a_signal_while_a_command_imports_jax_ends_it_with_one_line(sig, status, how):
    code = SIGNAL_DURING_IMPORT.format(sig=sig)
    result = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == status, result.stderr
    assert result.stderr == f"interrupted ({how}) before the command started\n"
    assert result.stdout == ""


def test_import_command_loads_jax_unless_help_or_the_command_needs_none():
    code = (
        "import sys; from flax_transformer.cli.process import import_command; "
        "import_command('flax_transformer.cli.launch', ['--nproc', '2', '--', 'train.py']); "
        "print('jax' in sys.modules); "
        "import_command('flax_transformer.cli.generate', ['--help']); "
        "print('jax' in sys.modules); "
        "import_command('flax_transformer.cli.generate', ['--workdir', 'x']); "
        "print('jax' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["False", "False", "True"], result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5])
def test_ctrl_c_early_in_train_py_is_never_a_traceback(tmp_path, delay):
    """The whole command: whether the signal lands in the interpreter's start (the signal's own
    action: -2, nothing printed, as a shell sees 130), the re-exec, the imports or the run."""
    proc = subprocess.Popen(
        [sys.executable, "train.py", "--steps", "2", "--workdir", str(tmp_path / "run")],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130, -signal.SIGINT), err
    assert "Traceback" not in out + err
    if proc.returncode == -signal.SIGINT:
        assert out + err == ""


def test_a_hook_installed_during_a_command_outlives_it_and_chains_without_a_cycle():
    """training.checkpoint drops Orbax's late "Event loop is closed" callbacks with an
    unraisable hook installed during a command; sigterm_raises put the hook of before back on
    its way out, and the callbacks that fired after a failed read printed their tracebacks
    (test_hf_cli, now and then). The hook stays now, and a second command chains through it
    without a cycle."""
    import types

    from flax_transformer.files.interruptions import sigterm_raises

    seen = []
    before = sys.unraisablehook
    try:
        sys.unraisablehook = lambda unraisable: seen.append(unraisable.exc_value)
        outer = sys.unraisablehook

        def drop_closed_loop(unraisable):
            if str(unraisable.exc_value) != "Event loop is closed":
                drop_closed_loop.previous(unraisable)

        def unraisable(err):
            sys.unraisablehook(types.SimpleNamespace(exc_value=err, object=None))

        with sigterm_raises():
            drop_closed_loop.previous, sys.unraisablehook = sys.unraisablehook, drop_closed_loop
        assert sys.unraisablehook is drop_closed_loop  # kept after the command
        unraisable(RuntimeError("Event loop is closed"))  # after the return: dropped
        with sigterm_raises(), sigterm_raises():  # the next command, nested: no cycle
            unraisable(RuntimeError("Event loop is closed"))
            unraisable(ValueError("other"))  # goes on to the hook of before
        assert [str(err) for err in seen] == ["other"]
        assert sys.unraisablehook is drop_closed_loop and outer is not drop_closed_loop
    finally:
        sys.unraisablehook = before
