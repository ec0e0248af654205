"""Start a multi-process train.py run on this machine: `python -m flax_transformer.launch`.

    python -m flax_transformer.launch --processes 2 -- train.py --mesh data=2 --workdir runs/x
    python -m flax_transformer.launch --processes 2 --devices-per-process 2 -- \\
        train.py --mesh data=2,model=2

Each of the N processes is the command after `--` (a `.py` file or `-m module` runs with this
Python) with `--coordinator 127.0.0.1:PORT --num-processes N --process-id I` appended, PORT a
free loopback port. On a CPU, `--devices-per-process D` gives each process D devices
(JAX_NUM_CPU_DEVICES). Their output is streamed line by line, prefixed with `[I]`. When a
process fails, the others are stopped (SIGTERM, then SIGKILL after --grace seconds) and the
launcher exits with the failed process's status, after saying which one it was. The same
train.py command runs on a cluster without this launcher: there each host starts its
processes with its own --process-id (or a SLURM / Open MPI job is detected).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

POLL_S = 0.1


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """(launcher options, the command after `--`); argparse errors (exit 2) for bad ones."""
    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.launch",
        description="Start N local processes of a multi-process train.py run.",
        epilog="example: python -m flax_transformer.launch --processes 2 -- train.py --mesh data=2",
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
        "--grace",
        type=flag_type(Float(ge=0.0), "--grace"),  # finite: nan would never wait, inf forever
        default=10.0,
        metavar="SECONDS",
        help="after a failure, how long the others get to stop before SIGKILL "
        "(default: %(default)s)",
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
        return None if os.path.isfile(first) else f"the command's script {first} does not exist"
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


def _stream(index: int, pipe, out, lock: threading.Lock) -> None:
    """Copies a process's output to `out`, each line (also a progress bar's \\r updates)
    prefixed with [index]."""
    pending = b""
    for chunk in iter(lambda: pipe.read1(65536), b""):
        pending += chunk.replace(b"\r", b"\n")
        *lines, pending = pending.split(b"\n")
        _write(out, lock, index, [line for line in lines if line.strip()])
    if pending.strip():
        _write(out, lock, index, [pending])


def _write(out, lock, index, lines) -> None:
    with lock:
        for line in lines:
            out.write(f"[{index}] {line.decode('utf-8', 'replace')}\n")
        out.flush()


def describe_status(code: int) -> str:
    """A process's exit code in words: "exited with status N", or "was killed by SIGNAME" for a
    negative code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch(command: list[str], processes: int, devices_per_process=None, grace=10.0, out=None):
    """Runs the processes to the end; the exit status: 0, or the first failed process's."""
    out = sys.stdout if out is None else out
    port = free_port()
    env = process_env(devices_per_process)
    lock = threading.Lock()
    children, streams = [], []
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
            stream = threading.Thread(target=_stream, args=(index, child.stdout, out, lock))
            stream.start()
            streams.append(stream)
        failed = _wait_for_first_failure(children)
        if failed is not None:
            code = children[failed].returncode
            others = [i for i, c in enumerate(children) if c.poll() is None]
            _say(out, lock, f"process {failed} {describe_status(code)}; stopping {others}")
            _stop(children, grace)
            return code if code > 0 else 1
        return 0
    finally:
        _stop(children, grace)  # e.g. Ctrl-C in the launcher
        for stream in streams:
            stream.join()


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
    return launch(command, args.processes, args.devices_per_process, args.grace)


if __name__ == "__main__":
    sys.exit(main())
