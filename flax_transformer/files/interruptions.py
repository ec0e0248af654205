"""Ctrl-C, SIGTERM and a full disk while a command writes: one line and an exit status, never
a traceback.

`sigterm_raises()` makes SIGTERM raise `Terminated` (a KeyboardInterrupt) in the main thread, as
Ctrl-C raises KeyboardInterrupt, so that cleanup runs for both (a staged directory is removed,
an atomic write leaves the old file). `one_line_failures` wraps a command's `main`: Ctrl-C
exits 130, SIGTERM 143 (the shell's 128 + signal number), out of space 1, a bad environment
setting (files.settings.SettingError) 2, each with one line.
Nothing half-written is left, because every write of the package is all-or-nothing
(files/atomic_io.py). The training command has its own, richer messages (training/interrupts.py).
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import os
import signal
import sys
import threading

from flax_transformer.files.settings import SettingError
from flax_transformer.files.space import is_out_of_space, out_of_space_message

EXIT_SIGINT = 128 + signal.SIGINT  # 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler `sigterm_raises` installs)."""


def exit_status(err: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (or the status an interruption carries itself)."""
    carried = getattr(err, "exit_status", None)
    if carried is not None:
        return carried
    return EXIT_SIGTERM if isinstance(err, Terminated) else EXIT_SIGINT


def _raise_terminated(signum, frame):
    distributed = sys.modules.get("flax_transformer.training.distributed")
    if distributed is not None and distributed.joined():
        # One process of a multi-process run: its cleanup would wait on the others (a save in
        # flight is collective), and the launcher stops them all with SIGTERM. End as before.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


def _deliver_again(unraisable) -> None:
    """sys.unraisablehook within sigterm_raises: an interruption raised where Python cannot
    propagate it (a garbage-collection callback such as JAX's `_xla_gc_callback`, a __del__)
    printed "Exception ignored in ..." with a traceback and was lost, the command going on to
    exit 0. Its signal is sent again instead, silently: the handler then raises it in the
    command's own code, which answers with its one line."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        terminated = isinstance(unraisable.exc_value, Terminated)
        # From another thread, a moment later: sent from here, the handler would run at once,
        # still inside this hook, and be lost again. (Lost again, it comes back here.)
        number = signal.SIGTERM if terminated else signal.SIGINT
        threading.Timer(0.01, _thread.interrupt_main, args=(number,)).start()
        return
    _deliver_again.previous(unraisable)


# The hook _deliver_again stands in front of: any other unraisable error goes on to it (e.g.
# training.checkpoint's, which drops Orbax's late "Event loop is closed" callbacks).
_deliver_again.previous = sys.__unraisablehook__


@contextlib.contextmanager
def sigterm_raises():
    """Within: SIGTERM raises Terminated (main thread only; elsewhere nothing changes), and an
    interruption lost in a finalizer is delivered again (_deliver_again)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_hook = sys.unraisablehook
    # Already in the chain (nested, or under a hook installed on top of it meanwhile, such as
    # training.checkpoint's for Orbax's late callbacks): nothing to install, nothing to undo.
    ours = not _chains_to_deliver_again(previous_hook)
    if ours:
        _deliver_again.previous, sys.unraisablehook = previous_hook, _deliver_again
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        # A hook installed on top meanwhile stays: put back, the previous one printed the
        # tracebacks of Orbax's callbacks that fire after a failed read, after the return.
        if ours and sys.unraisablehook is _deliver_again:
            sys.unraisablehook = previous_hook


def _chains_to_deliver_again(hook) -> bool:
    """Whether `hook` is _deliver_again or hands over to it (hooks that chain name the next
    one `previous`)."""
    for _ in range(16):
        if hook is _deliver_again:
            return True
        hook = getattr(hook, "previous", None)
        if hook is None:
            return False
    return False


@contextlib.contextmanager
def interrupt_exits_at_once():
    """Within (a command's process before its work begins: importing JAX, re-executing itself),
    Ctrl-C or SIGTERM ends the process at once with the one line and 130 / 143. Raised there
    instead, a KeyboardInterrupt printed a traceback from inside an import, and one unwinding
    through a half-imported extension crashed the process (SIGSEGV); a SIGTERM killed it
    silently (bench.chaos found them). Nothing was written yet, so nothing needs cleaning up.
    Main thread only; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum, frame):
        how = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        # os.write, not print: the handler may run inside a print of the interrupted code.
        os.write(2, f"interrupted ({how}) before the command started\n".encode())
        os._exit(128 + signum)

    numbers = {signal.SIGINT, signal.SIGTERM}
    previous = {number: signal.signal(number, exit_now) for number in numbers}
    # A re-exec blocks them across the exec (training/host_memory.py): one sent meanwhile is
    # pending, and is delivered here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, numbers)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def one_line_failures(main):
    """Decorator for a command's `main(argv) -> int`: an interruption, a full disk or a bad
    environment setting (files.settings) becomes one line on stderr and the exit status
    (130 / 143 / 1 / 2) instead of a traceback."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            with sigterm_raises():
                return main(*args, **kwargs)
        except KeyboardInterrupt as err:
            how = "SIGTERM" if isinstance(err, Terminated) else "Ctrl-C"
            said = str(err) or f"interrupted ({how}); nothing half-written was kept"
            print(said, file=sys.stderr)
            return exit_status(err)
        except SettingError as err:  # e.g. FLAX_TRANSFORMER_REORDER_KERNEL=bogus
            print(f"error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as err:  # an OSError, or a library's error that says so (Orbax)
            if not is_out_of_space(err):
                raise
            print(
                f"error: {out_of_space_message(err)}; nothing half-written was kept",
                file=sys.stderr,
            )
            return EXIT_FAILED

    return wrapped
