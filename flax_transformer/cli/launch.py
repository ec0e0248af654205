"""Start a multi-process train.py run on this machine: `ftx launch` (or `python -m
flax_transformer.launch`).

    ftx launch --processes 2 -- train.py --mesh data=2 --workdir runs/x
    ftx launch --processes 2 --devices-per-process 2 -- \\
        train.py --mesh data=2,model=2

Each of the N processes is the command after `--` (a `.py` file or `-m module` runs with this
Python) with `--coordinator 127.0.0.1:PORT --num-processes N --process-id I` appended, PORT a
free loopback port. On a CPU, `--devices-per-process D` gives each process D devices
(JAX_NUM_CPU_DEVICES). Their output is streamed line by line, prefixed with `[I]`. When a
process fails, the others are stopped (SIGTERM, then SIGKILL after --grace seconds) and the
launcher exits with the failed process's status. Its output always ends with one `[launch]`
line: the process that failed, its exit status and the last error it printed (or that all
succeeded). The same
train.py command runs on a cluster without this launcher: there each host starts its
processes with its own --process-id (or a SLURM / Open MPI job is detected).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.cli.process import exit_process

USES_JAX = False  # it starts processes that do (cli/process.import_command)

POLL_S = 0.1


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """(launcher options, the command after `--`); argparse errors (exit 2) for bad ones."""
    parser = argparse.ArgumentParser(
        prog="ftx launch",
        description="Start N local processes of a multi-process train.py run.",
        epilog="example: ftx launch --processes 2 -- ftx train --mesh data=2",
    )
    from flax_transformer.cli.flags import flag_type
    from flax_transformer.spec.validate import Float

    parser.add_argument("--processes", type=int, required=True, metavar="N")
    parser.add_argument(
        "--devices-per-process",
        type=int,
        metavar="D",
        help="CPU devices of each process (sets JAX_NUM_CPU_DEVICES; default: JAX's, 1)",
    )
    parser.add_argument(
        "--output",
        choices=tuple(OUTPUTS),
        default="first",
        help="first: every line of process 0 and the error lines of the others (they print "
        "the same run); all: every line of every process (default: %(default)s)",
    )
    parser.add_argument(
        "--grace",
        type=flag_type(Float(ge=0.0), "--grace"),  # finite: nan would never wait, inf forever
        default=10.0,
        metavar="SECONDS",
        help="after a failure, how long the others get to stop before SIGKILL "
        "(default: %(default)s)",
    )
    add_json_flag(
        parser,
        "the command, the process count and the exit status as JSON: alone (or `--json -`) on "
        "stdout, the processes' lines on stderr; `--json OUT` also writes it to the file OUT",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        parser.parse_known_args(argv)  # first, so that --help works without a command
        parser.error("give the command after --, e.g. -- train.py --mesh data=2")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("the command after -- is empty")
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        parser.error(f"--devices-per-process must be >= 1, got {args.devices_per_process}")
    joined = {"--coordinator", "--num-processes", "--process-id"}
    given = sorted(a.split("=")[0] for a in command if a.split("=")[0] in joined)
    if given:
        parser.error(f"the launcher sets {', '.join(given)} itself; leave it out of the command")
    return args, command


def missing_command(command: list[str]) -> str | None:
    """Why `command` cannot start (None: it can), checked once here rather than failing in
    every process: a .py file that is not there, a -m module that cannot be found, a program
    not on PATH."""
    import importlib.util
    import shutil

    first = command[0]
    if first.endswith(".py"):
        if os.path.isfile(first):
            return None
        hint = ""
        if os.path.basename(first) == "train.py":  # the repository's wrapper, run elsewhere
            hint = (
                " (train.py is in the repository's root; from any directory the training "
                "command is `ftx train`: ftx launch --processes N -- ftx train ...)"
            )
        return f"the command's script {first} does not exist{hint}"
    if first == "-m":
        if len(command) < 2:
            return "-m needs a module name, e.g. -- -m flax_transformer.train"
        try:
            found = importlib.util.find_spec(command[1]) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else f"the command's module {command[1]} (-m) cannot be found"
    if shutil.which(first) is None:
        return f"the command {first} is not a file and not on PATH"
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 (the OS picks it; free until someone else takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_command(command: list[str], port: int, count: int, index: int) -> list[str]:
    """The argv of process `index`: `command` (a .py file or -m module runs with this Python)
    with the flags that make it join the others."""
    first = command[0]
    prefix = [sys.executable] if first.endswith(".py") or first == "-m" else []
    joining = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(count)]
    return [*prefix, *command, *joining, "--process-id", str(index)]


def process_env(devices_per_process: int | None, environ=None) -> dict[str, str]:
    """The environment of each process: `environ` (default os.environ) with unbuffered output and,
    if given, JAX_NUM_CPU_DEVICES set to `devices_per_process`."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed
    if devices_per_process is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
    return env


# A line that reports an error: a Python exception line ("ValueError: ..."), "error: ..." as
# the project's commands print it, or a fatal message from the runtime.
ERROR_LINE = re.compile(
    r"^[\w.]*(?:Error|Exception|KeyboardInterrupt|SystemExit)\b"
    r"|\b(?i:error)\b|\b(?:Fatal|FATAL|Aborted|Killed|Segmentation fault)\b"
)


class ProcessOutput:
    """What one process printed that the final line needs: its last error line and its last
    line."""

    def __init__(self) -> None:
        self.last_error: str | None = None
        self.last_line: str | None = None

    def saw(self, line: str) -> None:
        """Note one line the process printed."""
        self.last_line = line
        if ERROR_LINE.search(line.strip()):
            self.last_error = line.strip()


def _stream(index: int, pipe, out, lock: threading.Lock, seen: ProcessOutput, shown) -> None:
    """Copies a process's output to `out`, each line (also a progress bar's \\r updates)
    prefixed with [index], and notes its error lines in `seen`; `shown(index, text)` says
    which lines are copied (OUTPUTS)."""
    pending = b""
    for chunk in iter(lambda: pipe.read1(65536), b""):
        pending += chunk.replace(b"\r", b"\n")
        *lines, pending = pending.split(b"\n")
        _write(out, lock, index, [line for line in lines if line.strip()], seen, shown)
    if pending.strip():
        _write(out, lock, index, [pending], seen, shown)


def _write(out, lock, index, lines, seen: ProcessOutput, shown) -> None:
    with lock:
        for line in lines:
            text = line.decode("utf-8", "replace")
            seen.saw(text)
            if shown(index, text):
                out.write(f"[{index}] {text}\n")
        out.flush()


# --output: which lines of the processes the launcher copies. The processes of one run print
# the same lines (the same loss, the same summary), so by default only process 0 is shown in
# full, and of the others their error lines; `all` shows every line of every process.
OUTPUTS = {
    "first": lambda index, text: index == 0 or bool(ERROR_LINE.search(text.strip())),
    "all": lambda index, text: True,
}


def describe_status(code: int) -> str:
    """A process's exit code in words: "exited with status N", or "was killed by SIGNAME" for a
    negative code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def final_line(failed: int | None, children, outputs: list[ProcessOutput], stopped) -> str:
    """The launcher's last line: which process failed, how, and the last error it printed (or
    its last line when it printed none); or that every process succeeded."""
    if failed is None:
        return f"all {len(children)} processes exited with status 0"
    seen = outputs[failed]
    if seen.last_error:
        said = f"its last error: {seen.last_error}"
    elif seen.last_line:
        said = f"it printed no error; its last line: {seen.last_line.strip()}"
    else:
        said = "it printed nothing"
    line = f"process {failed} {describe_status(children[failed].returncode)}; {said}"
    if stopped:
        line += f" (stopped processes {stopped})"
    return line


def launch(
    command: list[str], processes: int, devices_per_process=None, grace=10.0, out=None,
    output: str = "first",
):  # fmt: skip
    """Runs the processes to the end; the exit status: 0, or the first failed process's.
    The output (the lines OUTPUTS[output] shows) ends with one [launch] line (final_line)
    after every process's output."""
    out = sys.stdout if out is None else out
    port = free_port()
    env = process_env(devices_per_process)
    lock = threading.Lock()
    children, streams = [], []
    outputs = [ProcessOutput() for _ in range(processes)]
    failed, stopped = None, []
    try:
        for index in range(processes):
            child = subprocess.Popen(
                process_command(command, port, processes, index),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            children.append(child)
            stream = threading.Thread(
                target=_stream,
                args=(index, child.stdout, out, lock, outputs[index], OUTPUTS[output]),
            )
            stream.start()
            streams.append(stream)
        failed = _wait_for_first_failure(children)
        if failed is not None:
            stopped = [i for i, c in enumerate(children) if c.poll() is None]
            if stopped:
                _say(out, lock, f"process {failed} failed; stopping {stopped}")
    finally:
        _stop(children, grace)  # also on Ctrl-C in the launcher
        for stream in streams:
            stream.join()
    # After every process's output, so that it is the last line.
    _say(out, lock, final_line(failed, children, outputs, stopped))
    if failed is None:
        return 0
    code = children[failed].returncode
    return code if code > 0 else 1


def _wait_for_first_failure(children) -> int | None:
    """Index of the first process that fails, or None once all have succeeded."""
    while True:
        running = False
        for index, child in enumerate(children):
            code = child.poll()
            if code is None:
                running = True
            elif code != 0:
                return index
        if not running:
            return None
        time.sleep(POLL_S)


def _stop(children, grace: float) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _say(out, lock, text: str) -> None:
    with lock:
        out.write(f"[launch] {text}\n")
        out.flush()


def main(argv=None) -> int:
    """Entry point of `python -m flax_transformer.launch` / `ftx launch`: parse the flags and run
    the processes; return the exit status (the first failed process's, or 0)."""
    args, command = parse_args(argv)
    problem = missing_command(command)
    if problem:  # one line, before any process starts (not N tracebacks)
        print(f"error: {problem}; nothing was started", file=sys.stderr)
        return 2
    try:
        # --json alone: stdout holds the JSON only; the processes' lines go to stderr.
        out = sys.stderr if args.json == "-" else None
        code = launch(
            command, args.processes, args.devices_per_process, args.grace, out, args.output
        )
        result = {"command": command, "processes": args.processes, "exit_status": code}
        emit(result, (), args.json)
        return code
    except KeyboardInterrupt:  # the processes were stopped on the way out (launch's finally)
        print("[launch] interrupted (Ctrl-C); every process was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    exit_process(main())
