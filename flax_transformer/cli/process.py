"""How a command's process starts and ends: `run_command_and_exit("flax_transformer.cli.X")` in
every `if __name__ == "__main__"` (the import of the command inside it), `exit_process` after."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import NoReturn

from flax_transformer.files.interruptions import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    interrupt_exits_at_once,
    one_line_failures,
)


def exit_process(status) -> NoReturn:
    """sys.exit(status); after an interruption (exit 130 / 143) the process ends at once
    instead (stdout and stderr flushed, then os._exit), without Python's teardown. A run
    stopped while XLA compiles or runs a step still has XLA threads at work, and finalizing
    the interpreter under them crashed the process (SIGSEGV, exit -11) after its one line was
    said (bench.chaos found it). Every file was closed by the command's own cleanup already.
    Any other status: the signals are ignored from here on, so that the status is the one
    returned."""
    if status in (EXIT_SIGINT, EXIT_SIGTERM):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    # The work is done: a Ctrl-C or SIGTERM during the teardown would kill the process with the
    # signal (Python restores the default actions as it finalizes; ignored ones it leaves).
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    sys.exit(status)


def import_command(module_name: str, argv: list[str] | None = None):
    """Import a command's module in the command's own process, and JAX with it (unless the
    command says it needs none, `USES_JAX = False`, or --help is asked), Ctrl-C and SIGTERM
    ending the process at once meanwhile (files.interruptions.interrupt_exits_at_once).
    Loading JAX takes seconds; a Ctrl-C that stopped it halfway, in a command's own lazy
    import, crashed the process (SIGSEGV in jaxlib; bench.chaos found it)."""
    argv = sys.argv[1:] if argv is None else argv
    with interrupt_exits_at_once():
        module = importlib.import_module(module_name)
        if getattr(module, "USES_JAX", True) and not {"-h", "--help"} & set(argv):
            importlib.import_module("jax")
        return module


@one_line_failures
def run_main(module, argv: list[str] | None = None):
    """What the command `module`'s `main(argv)` returns (the code of a SystemExit it raises, as
    argparse does, included); an interruption, a full disk or a bad setting is one line."""
    try:
        return module.main(argv)
    except SystemExit as done:
        return done.code


def run_command_and_exit(module_name: str) -> NoReturn:
    """`python -m ...` / `python train.py`: run the command on sys.argv, end the process."""
    exit_process(run_main(import_command(module_name)))
